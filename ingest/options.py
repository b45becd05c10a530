"""What an ingest is asked to do, and what it reports per file."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tracetool.comm_kernels import Registry, parse_user_entry, registry
from tracetool.text import path_text

TRACE_SUFFIXES = (".json", ".json.gz")
ET_NAME = re.compile(r"_et\.json(\.gz)?$")


class UsageProblem(ValueError):
    """Options that cannot work together (reported as a usage error by the CLI)."""


@dataclass
class Options:
    store: Path | str  # a directory, or an object store URL (s3://bucket/prefix)
    job: str | None = None
    rank: int | None = None
    force: bool = False
    strict: bool = False
    workers: int = 0
    piece_bytes: int = 16 << 20  # decoded per worker task; bounds worker memory
    # small files derived together (build.build_files): per batch, at most this many files
    # and this much JSON (1: every file alone)
    batch_files: int = 16
    batch_bytes: int = 32 << 20
    memory_limit: str = "256MB"  # DuckDB's buffer pool for the derivation stage (it spills)
    # an event larger than this is quarantined unread (source.DEFAULT_MAX_EVENT_BYTES)
    max_event_bytes: int = 64 << 20
    tmp_budget: int | None = None  # bytes of work files per trace file (None: budget.py's default)
    shard: tuple[int, int] | None = None  # (I, N): build slice I of N and stage it (shard.py)
    executor: str = "local"  # local: this machine's worker pool; ray: one Ray task per file
    single_file: bool = False  # the ingest has one file: without a rank, it is rank 0
    job_per_file: bool = False  # each file its own job, named after the file
    recursive: bool = False  # a directory's subfolders' trace files too
    # --comm-kernel REGEX=KIND: kernels that are communication too (tracetool/comm_kernels.py)
    comm_kernels: tuple[str, ...] = ()

    def comm_registry(self) -> Registry:
        """The registry this ingest classifies kernels with: the user's entries first."""
        return registry().with_user(tuple(parse_user_entry(t) for t in self.comm_kernels))


@dataclass
class FileResult:
    path: str
    status: str  # ingested | skipped | error; staged (a shard's, until tracetool commit)
    message: str = ""
    job: str | None = None
    rank: int | None = None
    events_read: int = 0
    events_stored: int = 0
    events_quarantined: int = 0
    salvaged: bool = False
    json_bytes: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    store: str = ""
    sha256: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage
    built: str = ""  # work directory of the built partition, until committed

    def as_json(self) -> dict:
        return {
            "path": path_text(self.path), "status": self.status, "message": self.message,
            "job": self.job, "rank": self.rank, "store": path_text(self.store),
            "events_read": self.events_read, "events_stored": self.events_stored,
            "events_quarantined": self.events_quarantined, "salvaged": self.salvaged,
            "json_bytes": self.json_bytes, "seconds": round(self.seconds, 3),
            "warnings": self.warnings, "timings": self.timings,
        }
