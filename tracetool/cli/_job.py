"""The windows a command looks at (--annotation / --instance / --window): shared by the
commands that work on one job, which open it with ``tracetool.analysis.connect.open_job``."""

from __future__ import annotations

from collections.abc import Callable

import click

from tracetool.analysis.windows import Windows, parse_window
from tracetool.cli._numbers import Int
from tracetool.schema import MAX_STEP


def window_options(fn: Callable) -> Callable:
    """--annotation / --instance / --window: windows other than ProfilerStep (docs/steps.md)."""
    for opt in reversed([
        click.option("--annotation", help="Use the instances of this annotation (a CPU-thread "
                     "event name, e.g. a record_function label) instead of ProfilerSteps, "
                     "numbered 0, 1, ... per rank."),
        click.option("--instance", type=Int(0, MAX_STEP),
                     help="With --annotation: only this instance (0-based)."),
        click.option("--window", help="Use one time window instead of ProfilerSteps: "
                     "START:END after the job's first event, with units (e.g. 10ms:250ms), "
                     "inside the trace."),
    ]):
        fn = opt(fn)
    return fn


def windows_of(annotation: str | None, instance: int | None, window: str | None) -> Windows:
    """The Windows the options name (WindowError for a malformed or contradictory one)."""
    return Windows(annotation, instance, parse_window(window) if window else None)
