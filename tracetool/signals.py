"""SIGINT and SIGTERM as one exception, so a long command stops cleanly at any stage.

DuckDB turns a signal that arrives during a query into ``RuntimeError('Query interrupted')``
and drops the handler's exception; ``raise_if_interrupted`` recovers it from the flag the
handler leaves, so code that catches errors per file can tell an interruption from a bad file.

``deferred`` holds a signal back over a step that must finish once begun: a commit that makes
a rank visible and reports it (so an interrupt never leaves a committed file unreported), the
clean-up that removes an ingest's work files (so an interrupt never leaves one behind).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as shells do
_received: list[int] = []
_deferring = [0, 0]  # [depth of the ``deferred`` blocks under way, the signal they hold or 0]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``exit_code`` is 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = EXIT_CODES.get(signum, 128 + signum)


def _handler(signum: int, frame: FrameType | None) -> None:
    if _received:  # the first signal is being handled: let its clean-up finish
        return
    _received.append(signum)
    if _deferring[0]:  # raised when the deferred block ends
        _deferring[1] = signum
        return
    raise Interrupted(signum)


def raise_if_interrupted() -> None:
    """Raise Interrupted if a signal arrived (call where an error may hide one)."""
    if _received:
        raise Interrupted(_received[0])


@contextmanager
def deferred() -> Iterator[None]:
    """Within (under ``interruptible``): a signal is noted, not raised; it is raised
    (Interrupted) when the outermost such block ends, even if the block raised something
    else (then chained to it), so the step in the block is done whole, and a failure in it
    is not taken for a bad file. Holds a signal only as long as the step: keep the block to
    renames, reports and removals."""
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
        held = _deferring[1]
        if not _deferring[0] and held:
            _deferring[1] = 0
            raise Interrupted(held)


@contextmanager
def interruptible() -> Iterator[None]:
    """Within: SIGINT and SIGTERM raise Interrupted (once); the old handlers after."""
    old = {s: signal.signal(s, _handler) for s in EXIT_CODES}
    _received.clear()
    _deferring[1] = 0
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _received.clear()
        _deferring[1] = 0
