"""SIGINT and SIGTERM as one exception, so a long command stops cleanly at any stage.

DuckDB turns a signal that arrives during a query into ``RuntimeError('Query interrupted')``
and drops the handler's exception; ``raise_if_interrupted`` recovers it from the flag the
handler leaves, so code that catches errors per file can tell an interruption from a bad file.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as shells do
_received: list[int] = []


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
    raise Interrupted(signum)


def raise_if_interrupted() -> None:
    """Raise Interrupted if a signal arrived (call where an error may hide one)."""
    if _received:
        raise Interrupted(_received[0])


@contextmanager
def interruptible() -> Iterator[None]:
    """Within: SIGINT and SIGTERM raise Interrupted (once); the old handlers after."""
    old = {s: signal.signal(s, _handler) for s in EXIT_CODES}
    _received.clear()
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _received.clear()
