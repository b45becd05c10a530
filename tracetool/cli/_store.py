"""The STORE argument and ``--store`` option of every command: a directory, or an object
store's URL (``s3://bucket/prefix``, tracetool.objstore)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracetool.cli._errors import fail_line
from tracetool.errors import StoreError
from tracetool.objstore import NOT_UTF8, URL, parse_location
from tracetool.text import path_text


class StoreLocation(click.Path):
    """``click.Path`` for a directory (converted exactly as before), or a URL kept as its
    text: pathlib would fold ``s3://b/p`` into ``s3:/b/p``. An unsupported scheme or a
    malformed URL is a usage error."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str) and URL.match(value):
            try:
                return str(parse_location(value))
            except StoreError as err:
                self.fail(str(err), param, ctx)
        if isinstance(value, str) and path_text(value) != value:  # one line, as a bad store
            fail_line(f"{path_text(value)}: {NOT_UTF8}")
        return super().convert(value, param, ctx)


def store_arg(**kwargs: Any) -> StoreLocation:
    """The type of a STORE parameter: ``click.Path(path_type=Path, **kwargs)`` or a URL."""
    return StoreLocation(path_type=Path, **kwargs)
