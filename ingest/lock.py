"""Who holds a store: the commit lock, and the owner tag of every work directory.

The lock is ``flock`` on ``STORE/.lock``: the kernel releases it when its holder dies (even by
``kill -9``), so a stale lock never blocks anyone and breaking one needs no guess. The file's
text names the holder (pid, host, since when) for the message of whoever waits.

Work directories under ``STORE/.tmp`` are named after their owning process (host, pid and the
process's start time, so a reused pid is not mistaken for the owner); a later ingest, under
the lock, removes those whose owner on this host is gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from tracetool.errors import StoreError

LOCK_FILE = ".lock"
LOCK_TIMEOUT_S = 120.0  # commits take milliseconds; a holder this long is stuck or huge
_POLL_S = 0.05


class StoreBusy(StoreError):
    """Another process has held the store's lock for longer than the timeout."""


def _host() -> str:
    # '-' separates the fields of an owner tag
    return socket.gethostname().replace("-", "_") or "host"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: starttime


def _alive(pid: int, start: str) -> bool:
    if Path("/proc/self/stat").exists():
        now = _start_time(pid)
        return now is not None and (now == start or start == "?" or now == "?")
    try:  # no /proc: a signal-0 probe (a reused pid looks alive: never reclaimed wrongly)
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_tag() -> str:
    """``host-pid-start`` of this process: the prefix of its work directories."""
    pid = os.getpid()
    return f"{_host()}-{pid}-{_start_time(pid) or '?'}"


def owner_gone(name: str) -> bool:
    """True when ``name`` (a .tmp entry) belongs to a dead process of this host; False when
    the owner lives, is on another host, or the name is not an owner tag."""
    parts = name.split("-")
    if len(parts) < 4 or parts[0] != _host() or not parts[1].isdigit():
        return False
    return not _alive(int(parts[1]), parts[2])


def owner_elsewhere(name: str) -> bool:
    """True when ``name`` starts with the owner tag of a process on another host (whose
    liveness this host cannot see)."""
    parts = name.split("-")
    return len(parts) >= 4 and parts[1].isdigit() and parts[0] != _host()


class StoreLock:
    """Exclusive lock on a store for commits and reclaiming (a context manager)."""

    def __init__(self, root: Path, timeout_s: float = LOCK_TIMEOUT_S) -> None:
        self.path = Path(root) / LOCK_FILE
        self.timeout_s = timeout_s
        self._fd: int | None = None

    def __enter__(self) -> StoreLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise StoreError(f"{self.path.parent}: cannot write to the store: "
                             f"{err.strerror or err}") from None
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreBusy(f"{self.path.parent}: locked by {self._holder(fd)} "
                                        f"for over {self.timeout_s:.0f} s; try again when "
                                        "it is done") from None
                    time.sleep(_POLL_S)
            holder = {"pid": os.getpid(), "host": socket.gethostname(),
                      "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.ftruncate(fd, 0)
            os.close(fd)  # releases the flock

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            h = json.loads(os.pread(fd, 4096, 0) or b"{}")
            return f"pid {h['pid']} on {h['host']} since {h['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"
