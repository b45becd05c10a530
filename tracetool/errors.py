"""The errors every command reports, and how they are put in one line."""

from __future__ import annotations


class InputError(ValueError):
    """A user input that names nothing or would change nothing (an unknown GPU or kernel
    category, a pattern matching no kernel, an annotation the job does not have, a window
    outside the trace): the CLI prints one line and exits 2, as click does for bad usage."""


class StoreError(OSError):
    """The store cannot be used as asked (another format, locked, not writable): the CLI
    prints one line naming the store and exits 1."""


def one_line(err: BaseException) -> str:
    """An error's message in one line: its first line, plus DuckDB's hint when it has one
    (``Did you mean "step_breakdown"?``, on the line after a catalog error)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines()]
    if not lines or not lines[0]:
        return type(err).__name__
    hint = next((ln for ln in lines[1:3] if ln.startswith("Did you mean")), None)
    return f"{lines[0]} {hint}" if hint else lines[0]


def job_problem(store: object, jobs: list[str], job: str | None) -> str | None:
    """What is wrong with choosing ``job`` (None: the only one) among a store's ``jobs``, in
    the one wording every command uses; None when the choice is fine."""
    if not jobs:
        return f"{store}: the store holds no ingested traces"
    if job is None and len(jobs) != 1:
        return f"{store}: the store holds jobs {', '.join(jobs)}: choose one with --job"
    if job is not None and job not in jobs:
        return f"{store}: no job {job!r} (the store holds {', '.join(jobs)})"
    return None
