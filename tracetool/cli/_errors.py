"""The one-line error every command ends with on bad input: ``tracetool: error: ...``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from tracetool.errors import InputError, one_line
from tracetool.outputs import OutputError


class OptionError(click.BadParameter):
    """A bad option value: one line (``tracetool: error: Invalid value for '--step': ...``)
    and exit 2, instead of click's usage block; raised by the option types of ``_numbers``."""

    def show(self, file: object = None) -> None:
        click.echo(f"tracetool: error: {one_line(Exception(self.format_message()))}", err=True)


def fail_line(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` as one error line on stderr and exit with ``code``."""
    click.echo(f"tracetool: error: {message}", err=True)
    sys.exit(code)


def fail_for(store: Path | str, err: Exception) -> NoReturn:
    """The error line of a command over ``store`` that raised ``err``: click's own errors
    as they are; an input that names or changes nothing (InputError, an output inside a
    store) with exit 2, a usage error as click's; an output path that cannot be written
    (OutputError) naming its option; anything else by its first line, naming the store
    once."""
    if isinstance(err, click.ClickException | OutputError):
        fail_line(err.message if isinstance(err, click.ClickException) else one_line(err))
    if isinstance(err, InputError):
        fail_line(one_line(err), code=2)
    line = one_line(err)
    fail_line(line if line.startswith(f"{store}:") else f"{store}: {line}")
