"""The one-line error every command ends with on bad input: ``tracetool: error: ...``."""

from __future__ import annotations

import sys
from typing import NoReturn

import click


def fail_line(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` as one error line on stderr and exit with ``code``."""
    click.echo(f"tracetool: error: {message}", err=True)
    sys.exit(code)
