"""The error every command reports as a usage error (one line, exit 2)."""

from __future__ import annotations


class InputError(ValueError):
    """A user input that names nothing or would change nothing (an unknown GPU or kernel
    category, a pattern matching no kernel, an annotation the job does not have, a window
    outside the trace): the CLI prints one line and exits 2, as click does for bad usage."""


class StoreError(OSError):
    """The store cannot be used as asked (another format, locked, not writable): the CLI
    prints one line naming the store and exits 1."""
