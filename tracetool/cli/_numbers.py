"""The numeric option types of the commands: every number is bounded where the option is
defined (the range shows in ``--help``), and a value outside it, or not a number, is one line
and exit 2 (``OptionError``), never a traceback or a usage block."""

from __future__ import annotations

from typing import Any

import click

from tracetool.cli._errors import OptionError


class OneLine(click.ParamType):
    """A click type whose failures are ``OptionError`` (one line)."""

    def fail(self, message: str, param: click.Parameter | None = None,
             ctx: click.Context | None = None) -> Any:
        raise OptionError(message, ctx=ctx, param=param)


class Int(OneLine, click.IntRange):
    """``click.IntRange`` from ``lo`` to ``hi`` (None: no upper end, for a value capped
    later, like ``--workers``), failing in one line."""

    name = "integer"

    def __init__(self, lo: int, hi: int | None) -> None:
        click.IntRange.__init__(self, min=lo, max=hi)
