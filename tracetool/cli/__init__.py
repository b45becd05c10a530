"""The ``tracetool`` command line: one module per command."""

from __future__ import annotations

import click

from tracetool import __version__

from .critical_path import critical_path_command
from .diff import diff_command
from .ingest import ingest_command
from .replay import replay_command
from .report import report_command
from .sql import sql_command
from .sweep import sweep_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracetool")
def cli() -> None:
    """Ingest, analyse and replay PyTorch profiler (Kineto) traces."""


cli.add_command(ingest_command)
cli.add_command(sql_command)
cli.add_command(report_command)
cli.add_command(diff_command)
cli.add_command(critical_path_command)
cli.add_command(replay_command)
cli.add_command(sweep_command)


def main() -> None:
    cli()
