"""The files a command writes for its user (``--chrome-trace``, ``--plot``, ``--output``, the
``--out`` directories of report and sweep): never inside a store, and always whole.

``check_output`` runs before a command does any work: it refuses a path inside a store the
command reads or inside any tracetool store directory (a directory holding ``format.json``
or ``data/job=*``; or tracetool's cache of object-store files), with symlinks resolved, so a
result can never overwrite one of a store's files; and it refuses a path that cannot be
written (a file where a directory is needed, a directory that is not writable, a device or
``/proc`` file), so that such an error is one line before the work rather than a traceback
after it. Missing parent directories are made when the file is written.

``atomic_write`` writes every such file: into a temporary file beside it (``.NAME.*.tmp``,
made with the usual permissions), renamed over ``NAME`` only when complete, so a failed or
interrupted write leaves the old file (or none), never half a file. The rename replaces the
directory entry: a symlink at ``NAME`` is replaced, never written through.

This module stays light (no DuckDB, no pyarrow): the report's chart process imports it.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tracetool.errors import InputError
from tracetool.text import path_text, printable


class InsideStore(InputError):
    """An output path inside a store: refused (one line, exit 2) before any work."""


class OutputError(OSError):
    """An output path that cannot be written (the message names the option and why): one
    line, exit 1, before any work."""


def is_store_dir(d: Path) -> bool:
    """Whether directory ``d`` is a tracetool store: it holds the ``format.json`` every
    ingest writes, or (a store from before format.json) ``data/job=*`` partitions."""
    try:
        return (d / "format.json").is_file() or any((d / "data").glob("job=*"))
    except OSError:
        return False


def check_output(path: Path, option: str, stores: Iterable[Path | str] = (),
                 directory: bool = False) -> None:
    """Refuse, before any work, an output ``path`` (a file, or with ``directory`` the
    directory the files go in) that lies in one of ``stores`` or in any store directory
    (InsideStore), or that cannot be written there (OutputError); ``option`` names it."""
    from tracetool import objstore
    from tracetool.store_views import local_root

    real = Path(os.path.realpath(path))
    chain = [real, *real.parents]
    path = _shown(path)
    for store in stores:
        root = local_root(store)
        # a directory that is no store (yet) is the command's own one-line error, not this
        if root in chain and (objstore.is_object_store(store) or is_store_dir(root)):
            where = "is the store" if root == real else "is inside the store"
            raise InsideStore(f"{option}: {path} {where} {_shown(store)}: write it outside "
                              "the store")
    cache = Path(os.path.realpath(objstore.cache_root()))
    for d in chain:
        if d == cache:
            raise InsideStore(f"{option}: {path} is inside tracetool's cache of object-store "
                              f"files ({cache}): write it elsewhere")
        if is_store_dir(d):
            where = "is the store" if d == real else "is inside the store"
            raise InsideStore(f"{option}: {path} {where} {_shown(d)}: write it outside the "
                              "store")
    _check_writable(path, real, option, directory)


def _shown(p: Path | str) -> str:
    """A path in an error line: as text, control characters escaped (tracetool.text)."""
    return printable(path_text(p))


def _check_writable(path: str, real: Path, option: str, directory: bool) -> None:
    """OutputError unless the file (or directory) ``path``, resolved to ``real``, can be
    written: what exists there is of the right kind and its directory takes a new file."""
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise OutputError(f"{option}: {path}: {err.strerror}") from None
    if st is not None:
        if directory and not stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{option}: {path} is not a directory")
        if not directory and not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{option}: {path} is not a regular file")
    folder = real if directory else real.parent
    existing = next(d for d in (folder, *folder.parents) if os.path.lexists(d))
    if not os.path.isdir(existing):
        raise OutputError(f"{option}: {path}: {_shown(existing)} is not a directory")
    # tried, not asked (os.access says yes to root on /proc): the directory takes a new
    # file, or when it is missing (made when written), its nearest existing parent takes a
    # new directory
    probe = existing / f".tracetool-probe-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        if existing == folder:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.unlink(probe)
        else:
            os.mkdir(probe)
            os.rmdir(probe)
    except OSError as err:
        what = "write" if existing == folder else "make a directory"
        raise OutputError(f"{option}: {path}: cannot {what} in {_shown(existing)} "
                          f"({err.strerror})") from None


def _temp_in(folder: Path, name: str) -> tuple[int, Path]:
    """A new file in ``folder`` for ``name``'s contents (hidden, unique, umask applied; the
    name cut so that the temporary name fits where ``name`` does)."""
    short = os.fsdecode(os.fsencode(name)[:200])
    tmp = folder / f".{short}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp


@contextmanager
def atomic_write(path: Path, mode: str = "wb", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """A file object whose contents become ``path`` when the block ends without an error
    (written to a temporary file beside it, then renamed over it); on an error or an
    interrupt the temporary file is removed and ``path`` is as it was. Missing parent
    directories are made. ``mode``: "wb" or "w" (then ``open_kwargs`` such as encoding)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_in(path.parent, path.name)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """``text`` as ``path`` (UTF-8), atomically."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)


def save_png(fig: Any, path: Path) -> None:
    """A matplotlib figure as the PNG ``path``, atomically, cropped to what was drawn
    (legends sit outside the axes)."""
    with atomic_write(path) as f:
        fig.savefig(f, format="png", bbox_inches="tight")
