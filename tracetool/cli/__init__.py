"""The ``tracetool`` command line: one module per command, imported when its command runs.

Loading a command's module pulls in what it needs (DuckDB, polars, the replay models); a
lazy group keeps ``tracetool ingest`` from paying for the others at start-up.
"""

from __future__ import annotations

import importlib

import click

from tracetool import __version__

# command name -> "module:function", in the order ``--help`` lists them
COMMANDS = {
    "ingest": "ingest:ingest_command",
    "commit": "commit:commit_command",
    "pack": "pack:pack_command",
    "sql": "sql:sql_command",
    "report": "report:report_command",
    "diff": "diff:diff_command",
    "critical-path": "critical_path:critical_path_command",
    "replay": "replay:replay_command",
    "sweep": "sweep:sweep_command",
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracetool")
def cli() -> None:
    """Ingest, analyse and replay PyTorch profiler (Kineto) traces."""


def main() -> None:
    cli()
