"""Where each rank runs: rank -> node, node -> datacenter (``--placement FILE``).

One object, built either way: ``Placement.blocks(gpus_per_node, ranks_per_dc)`` is the
shorthand of contiguous blocks (ranks ``[k * gpus_per_node, (k + 1) * gpus_per_node)`` on node
k, ``[k * ranks_per_dc, ...)`` in datacenter k), ``read_placement(path)`` a file's arbitrary map.
Both are a table over one period of ranks plus how far the node and datacenter numbers move
per period, so a rank past the table (``--dp-scale``'s projected ranks, "placed like the
traced ones") is placed like its rank modulo the period on new nodes (and, with more than one
datacenter, in new datacenters). The network model (``network.py``) reads placements only
through ``where``.

File formats (README "Network model"):

- CSV with the header ``rank,node,datacenter`` (or ``rank,node``: one datacenter), one line
  per rank; node and datacenter are names (any text without a comma).
- TOML: ``[nodes]`` maps each node's name to its ranks, optional ``[datacenters]`` maps each
  datacenter's name to its nodes' names::

      [nodes]
      a = [0, 2, 4, 6]
      b = [1, 3, 5, 7]
      [datacenters]
      east = ["a"]
      west = ["b"]

Checked when read (``InputError``, one line naming the file): ranks are whole numbers
0 to MAX_WORLD - 1, each placed once, 0 to n - 1 with none missing; a node is in one
datacenter; every node of a TOML file's ``[datacenters]`` is one of its ``[nodes]`` and every
node is in a datacenter. Against the job (``check_covers``): exactly its ranks.
"""

from __future__ import annotations

import csv
import io
import math
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from tracetool.errors import InputError

MAX_WORLD = 131_072  # as network.MAX_WORLD: the most ranks the model prices
MAX_FILE_BYTES = 16 << 20  # a placement of MAX_WORLD ranks with long names is ~10 MB
MAX_NAME = 256  # characters of a node or datacenter name


@dataclass(frozen=True, eq=False)
class Placement:
    """rank -> (node, datacenter) numbers: ``node[r % period] + (r // period) * node_step``
    (the same for datacenters). ``source``: the file, or the shorthand, for messages."""

    node: np.ndarray  # int64, one period of ranks
    dc: np.ndarray
    node_step: int
    dc_step: int
    source: str

    @staticmethod
    @lru_cache(maxsize=64)
    def blocks(gpus_per_node: int, ranks_per_dc: int | None) -> Placement:
        """Contiguous blocks (the ``gpus_per_node`` / ``ranks_per_dc`` shorthand)."""
        period = math.lcm(gpus_per_node, ranks_per_dc) if ranks_per_dc else gpus_per_node
        r = np.arange(period, dtype=np.int64)
        dc = r // ranks_per_dc if ranks_per_dc else np.zeros(period, dtype=np.int64)
        return Placement(r // gpus_per_node, dc, period // gpus_per_node,
                         period // ranks_per_dc if ranks_per_dc else 0,
                         f"gpus_per_node={gpus_per_node}"
                         + (f",ranks_per_dc={ranks_per_dc}" if ranks_per_dc else ""))

    @property
    def explicit(self) -> bool:
        """A file's placement (not the shorthand's blocks)."""
        return not self.source.startswith("gpus_per_node=")

    @property
    def size(self) -> int:
        return len(self.node)

    def where(self, ranks: object) -> tuple[np.ndarray, np.ndarray]:
        """(node, datacenter) numbers of ``ranks`` (array-like of ints)."""
        a = np.asarray(ranks, dtype=np.int64)
        rep, r = np.divmod(a, len(self.node))
        return self.node[r] + rep * self.node_step, self.dc[r] + rep * self.dc_step

    def __eq__(self, other: object) -> bool:
        """The same rank -> (node, datacenter) map, however built: two maps of this form
        agree everywhere when they agree on two common periods."""
        if not isinstance(other, Placement):
            return NotImplemented
        common = math.lcm(self.size, other.size)
        if common > 4 * MAX_WORLD:
            return False  # periods this far apart cannot place ranks alike
        r = np.arange(2 * common)
        return all(np.array_equal(a, b) for a, b in zip(self.where(r), other.where(r),
                                                        strict=True))

    def __hash__(self) -> int:
        return hash(tuple(np.concatenate(self.where([0, 1])).tolist()))

    def __repr__(self) -> str:
        return f"Placement({self.source!r}, {self.size} ranks)"

    def check_covers(self, world: int, job: str) -> None:
        """InputError unless a file's placement places exactly ranks 0 to ``world`` - 1."""
        if self.explicit and self.size != world:
            raise InputError(f"placement {self.source}: places ranks 0-{self.size - 1}, but job "
                             f"{job} has {world} ranks (0-{world - 1}): place each exactly once")


def read_placement(path: str | Path) -> Placement:
    """The placement in CSV or TOML file ``path`` (TOML if its name ends in .toml), checked
    (module docstring); InputError naming the file and the problem."""
    name = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise InputError(f"cannot read placement {name}: {err.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"placement {name}: larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"placement {name}: not UTF-8 text") from None
    rows = _toml_rows(name, text) if name.endswith(".toml") else _csv_rows(name, text)
    return _build(name, rows)


def _csv_rows(name: str, text: str) -> list[tuple[object, str, str, str]]:
    """(rank, node, datacenter, where) per line of a CSV placement."""
    lines = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    header = [h.strip().lower() for h in next(lines, [])]
    if header not in (["rank", "node", "datacenter"], ["rank", "node"]):
        raise InputError(f"placement {name}: the first line must be the header "
                         f"rank,node,datacenter (or rank,node), not {','.join(header)!r}")
    rows = []
    for i, cells in enumerate(lines, start=2):
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise InputError(f"placement {name}: line {i} has {len(cells)} fields, the header "
                             f"{len(header)}")
        cells = [c.strip() for c in cells]
        rows.append((cells[0], cells[1], cells[2] if len(cells) == 3 else "", f"line {i}"))
    return rows


def _toml_rows(name: str, text: str) -> list[tuple[object, str, str, str]]:
    """(rank, node, datacenter, where) per rank of a TOML placement."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"placement {name}: bad TOML: {err}") from None
    unknown = sorted(set(doc) - {"nodes", "datacenters"})
    if unknown or not isinstance(doc.get("nodes"), dict):
        raise InputError(f"placement {name}: give a [nodes] table (node = [ranks]) and "
                         f"optionally [datacenters] (datacenter = [nodes])"
                         + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    nodes, dcs = doc["nodes"], doc.get("datacenters", {})
    if not isinstance(dcs, dict):
        raise InputError(f"placement {name}: [datacenters] must map names to lists of nodes")
    dc_of: dict[str, str] = {}
    for dc, members in dcs.items():
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise InputError(f"placement {name}: datacenter {dc!r} must list node names")
        for m in members:
            if m not in nodes:
                raise InputError(f"placement {name}: datacenter {dc!r} lists node {m!r}, "
                                 "which [nodes] does not have")
            if m in dc_of and dc_of[m] != dc:
                raise InputError(f"placement {name}: node {m!r} is in two datacenters, "
                                 f"{dc_of[m]!r} and {dc!r}")
            dc_of[m] = dc
    rows = []
    for node, ranks in nodes.items():
        if not isinstance(ranks, list):
            raise InputError(f"placement {name}: node {node!r} must list its ranks")
        if dcs and node not in dc_of:
            raise InputError(f"placement {name}: node {node!r} is in no datacenter")
        rows += [(r, node, dc_of.get(node, ""), f"node {node!r}") for r in ranks]
    return rows


def _rank(name: str, value: object, where: str) -> int:
    n = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 12:
        n = int(value)
    if n is None or not 0 <= n < MAX_WORLD:
        raise InputError(f"placement {name}: {where}: rank {value!r} is not a whole number "
                         f"from 0 to {MAX_WORLD - 1}")
    return n


def _build(name: str, rows: list[tuple[object, str, str, str]]) -> Placement:
    if not rows:
        raise InputError(f"placement {name}: places no rank")
    if len(rows) > MAX_WORLD:
        raise InputError(f"placement {name}: places {len(rows)} ranks, more than {MAX_WORLD}")
    seen: dict[int, str] = {}
    node_dc: dict[str, tuple[str, str]] = {}
    by_rank: dict[int, tuple[str, str]] = {}
    for value, node, dc, where in rows:
        r = _rank(name, value, where)
        for what, text in (("node", node), ("datacenter", dc)):
            if (what == "node" and not text) or len(text) > MAX_NAME:
                raise InputError(f"placement {name}: {where}: give a {what} name of 1 to "
                                 f"{MAX_NAME} characters")
        if r in seen:
            raise InputError(f"placement {name}: rank {r} placed twice ({seen[r]} and {where})")
        seen[r] = where
        if node in node_dc and node_dc[node][0] != dc:
            first_dc, first_where = node_dc[node]
            raise InputError(f"placement {name}: node {node!r} is in two datacenters, "
                             f"{first_dc!r} ({first_where}) and {dc!r} ({where})")
        node_dc.setdefault(node, (dc, where))
        by_rank[r] = (node, dc)
    n = len(by_rank)
    missing = [r for r in range(n) if r not in by_rank]
    if missing:
        raise InputError(f"placement {name}: places {n} ranks but not rank {missing[0]}: give "
                         f"ranks 0 to {n - 1}, each once")
    node_ids: dict[str, int] = {}
    dc_ids: dict[str, int] = {}
    node = np.empty(n, dtype=np.int64)
    dcs = np.empty(n, dtype=np.int64)
    for r in range(n):  # numbered by first appearance in rank order
        nd, dc = by_rank[r]
        node[r] = node_ids.setdefault(nd, len(node_ids))
        dcs[r] = dc_ids.setdefault(dc, len(dc_ids))
    return Placement(node, dcs, len(node_ids), len(dc_ids) if len(dc_ids) > 1 else 0, name)
