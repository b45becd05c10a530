"""One vocabulary: the replay builds on the objects the analysis defines (the graph's
cp_nodes and edges, stored at ingest; collective_ranks' instance key, kind and bytes) and
leaves nothing else in the caller's connection."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tracetool
from tracetool.replay import Replayer

from ._util import SHARED_TRACES


@pytest.fixture(scope="module")
def store(shared_store: Callable[[str], Path]) -> Path:
    """Job gloo (the sample) and, with the corpus, job dlrm: read-only, shared."""
    return shared_store("gloo_dlrm" if SHARED_TRACES.is_dir() else "gloo")


def _objects(con) -> set[str]:  # noqa: ANN001
    return {n for (n,) in con.execute(
        "SELECT table_name FROM information_schema.tables").fetchall()}


def test_replay_leaves_only_the_graph_in_the_callers_connection(store: Path) -> None:
    con = tracetool.connect(store)
    before = _objects(con)
    Replayer.from_store(con, "gloo").run()
    assert "cp_nodes" in before and "edges" in before  # the graph: views over the store
    assert _objects(con) - before == set()


@pytest.mark.parametrize("job", ["gloo", "dlrm"])
def test_replay_instances_are_collective_instances(store: Path, job: str) -> None:
    """The replay's barriers are collective_instances' instances, same key, kind and bytes."""
    if job == "dlrm" and not SHARED_TRACES.is_dir():
        pytest.skip("real trace corpus not found")
    con = tracetool.connect(store)
    want = {i: (k, b) for i, k, b in con.execute(
        """SELECT instance, any_value(kind), any_value(bytes) FROM collective_instances
           WHERE job = ? GROUP BY instance""", [job]).fetchall()}
    g = Replayer.from_store(con, job).graph
    got = {str(i): (str(k), None if np.isnan(b) else int(b))
           for i, k, b in zip(g.insts["instance"], g.insts["kind"], g.insts["bytes"],
                              strict=True)}
    assert want and got == want
