"""The registry of communication kernels (``comm_kernels.toml``): the one place that says
which GPU kernels are communication, which collective they do, which library ran them and
where their size comes from.

Ingest reads it to set ``gpu_ops.is_comm`` (``sql_condition``) and to make collectives of
the comm kernels no call record claims (``Registry.classify``); every analysis view and the
replay read ``is_comm`` from there, so a kernel the registry matches is communication
everywhere. Users add entries at ingest time (``tracetool ingest --comm-kernel REGEX=KIND``,
``parse_user_entry``): classification is stored with the traces, so the option belongs to
the command that stores them, and shows in the command line that built the store.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources

from tracetool.errors import InputError
from tracetool.sqltext import literal

# collective_kind names (analysis/sql/40_collectives.sql); "name": read from the kernel name
KINDS = ("allreduce", "allgather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
         "send", "recv", "barrier", "other")
SIZES = ("call", "launch_op", "none")
# a kernel whose args record a collective (newer PyTorch adds "Collective name" to the
# kernel's own args): communication whatever its name
ARGS_RULE = "args LIKE '%\"Collective name\"%'"
# the collective in an NCCL-style kernel name (kind = "name"), tested in this order
NAME_KINDS = (("allreduce", "allreduce"), ("all_reduce", "allreduce"),
              ("allgather", "allgather"), ("all_gather", "allgather"),
              ("reducescatter", "reduce_scatter"), ("reduce_scatter", "reduce_scatter"),
              ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
              ("sendrecv", "sendrecv"), ("broadcast", "broadcast"), ("barrier", "barrier"),
              ("reduce", "reduce"), ("send", "send"), ("recv", "recv"))


@dataclass(frozen=True)
class Entry:
    """One way of naming communication kernels."""

    backend: str
    pattern: str
    kind: str
    size: str
    source: str

    @functools.cached_property
    def regex(self) -> re.Pattern:
        return re.compile(self.pattern, re.IGNORECASE)

    def kind_of(self, name: str) -> str | None:
        """The collective a kernel of this entry does (None: its name says none)."""
        if self.kind != "name":
            return self.kind
        fn = name.split("(", 1)[0].lower()
        return next((c for key, c in NAME_KINDS if key in fn), None)


@dataclass(frozen=True)
class Registry:
    """The entries in order: the user's (``--comm-kernel``) first, then the package's."""

    entries: tuple[Entry, ...]

    def match(self, name: str) -> Entry | None:
        return next((e for e in self.entries if e.regex.search(name)), None)

    def with_user(self, user: tuple[Entry, ...]) -> Registry:
        return Registry(tuple(user) + self.entries) if user else self

    def sql_condition(self, name: str = "name", args: str = "args") -> str:
        """A DuckDB boolean: the kernel named by column ``name`` is communication (one RE2
        alternation of every pattern, or its args record a collective)."""
        alt = "|".join(f"(?:{e.pattern})" for e in self.entries)
        return (f"(regexp_matches({name}, {literal(alt)}, 'i') OR "
                f"{ARGS_RULE.replace('args', args, 1)})")


def _entry(d: dict, where: str) -> Entry:
    missing = {"backend", "pattern", "kind", "size", "source"} - d.keys()
    if missing:
        raise InputError(f"{where}: missing {', '.join(sorted(missing))}")
    if d["kind"] not in KINDS + ("name",):
        raise InputError(f"{where}: unknown kind {d['kind']!r}")
    if d["size"] not in SIZES:
        raise InputError(f"{where}: unknown size {d['size']!r}")
    e = Entry(str(d["backend"]), str(d["pattern"]), d["kind"], d["size"], str(d["source"]))
    _compile(e.pattern, where)
    return e


def _compile(pattern: str, where: str) -> None:
    """Both engines must take it: Python's (classify) and DuckDB's RE2 (is_comm)."""
    try:
        re.compile(pattern)
    except re.error as err:
        raise InputError(f"{where}: bad regular expression {pattern!r}: {err}") from None
    import duckdb

    try:
        duckdb.execute(f"SELECT regexp_matches('', {literal(pattern)}, 'i')")
    except (duckdb.Error, ValueError) as err:
        first = str(err).splitlines()[0]
        raise InputError(f"{where}: regular expression {pattern!r} is not one DuckDB (RE2) "
                         f"reads: {first}") from None


@functools.cache
def registry() -> Registry:
    """The package's registry (comm_kernels.toml), read once."""
    text = resources.files("tracetool").joinpath("comm_kernels.toml").read_text("utf-8")
    rows = tomllib.loads(text).get("kernel", [])
    return Registry(tuple(_entry(d, f"comm_kernels.toml entry {i + 1}")
                          for i, d in enumerate(rows)))


def parse_user_entry(text: str) -> Entry:
    """``REGEX=KIND`` from ``--comm-kernel`` (split at the last ``=``: a pattern may hold
    one); backend ``user``, size from the launching op's shapes where recorded."""
    pattern, sep, kind = text.rpartition("=")
    kind = kind.strip().lower()
    if not sep or not pattern:
        raise InputError(f"--comm-kernel {text!r}: use REGEX=KIND, e.g. "
                         f"'my_allreduce_kernel=allreduce'; kinds: {', '.join(KINDS)}")
    if kind not in KINDS:
        raise InputError(f"--comm-kernel {text!r}: unknown kind {kind!r}; known: "
                         f"{', '.join(KINDS)}")
    _compile(pattern, f"--comm-kernel {text!r}")
    return Entry("user", pattern, kind, "launch_op", "--comm-kernel")
