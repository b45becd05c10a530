"""The trace store on disk: where each (job, rank) lives and how it is replaced atomically.

Layout: ``STORE/data/job=J/rank=R/<table>/part-N.parquet``. An ingest builds the whole ``rank=R``
directory under ``STORE/.tmp/`` (same file system) and renames it into place, so readers see
either the old partition or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from tracetool.store_views import STORE_FORMAT, check_format

from .options import UsageProblem

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
MAX_JOB_NAME = 200  # the job=<name> directory must fit a file name (255 bytes)


@dataclass(frozen=True)
class StoredFile:
    job: str
    rank: int
    path: str
    file_name: str
    sha256: str
    bytes: int


class Store:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.data = self.root / "data"
        self.tmp = self.root / ".tmp"

    def create(self) -> None:
        """Make the store's directory (UsageProblem when the path cannot be one)."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageProblem(f"--store {self.root} is not a directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UsageProblem(f"cannot create the store {self.root}: "
                               f"{err.strerror or err}") from None

    def check_format(self) -> None:
        """A store with data must be of this tracetool's format (StoreFormatError)."""
        if self.data.is_dir():
            check_format(self.root)

    def _write_format(self) -> None:
        f = self.root / "format.json"
        if not f.exists():
            tmp = self.root / f".format.json.{uuid.uuid4().hex}"
            tmp.write_text(json.dumps({"format": STORE_FORMAT}) + "\n")
            os.replace(tmp, f)

    def partition(self, job: str, rank: int) -> Path:
        return self.data / f"job={job}" / f"rank={rank}"

    def new_workdir(self) -> Path:
        d = self.tmp / uuid.uuid4().hex
        d.mkdir(parents=True)
        return d

    def stored_files(self) -> list[StoredFile]:
        out = []
        for f in sorted(self.data.glob("job=*/rank=*/trace_files/*.parquet")):
            part = f.parent.parent
            job = part.parent.name.split("=", 1)[1]
            rank = int(part.name.split("=", 1)[1])
            t = pq.read_table(f, columns=["path", "file_name", "sha256", "bytes"]).to_pylist()
            for r in t:
                out.append(StoredFile(job, rank, r["path"], r["file_name"], r["sha256"],
                                      r["bytes"]))
        return out

    def commit(self, job: str, rank: int, built: Path) -> None:
        """Move a fully written partition into place, replacing any old one."""
        self._write_format()
        target = self.partition(job, rank)
        target.parent.mkdir(parents=True, exist_ok=True)
        trash = None
        if target.exists():
            trash = self.tmp / f"trash-{uuid.uuid4().hex}"
            target.rename(trash)
        built.rename(target)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)

    def cleanup(self, workdir: Path) -> None:
        shutil.rmtree(workdir, ignore_errors=True)
        try:
            self.tmp.rmdir()
        except OSError:
            pass
