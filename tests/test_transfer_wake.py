"""A thread that waits for its own gloo collective inside the op that enqueued it (the MoE
job's autograd function around ``all_to_all_single``: ``AllToAll`` calls
``c10d::alltoall_base_``, then blocks until the ``gloo:all_to_all`` span on the runloop thread
ends) is bound to that span's end by a ``transfer_wake`` edge into the op's end, so a
projection that shortens or lengthens the transfer moves the op's end with it."""

from __future__ import annotations

import duckdb
import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest

from ._util import REPO

NETLAB = REPO / "sample_traces" / "netlab"


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    store = tmp_path_factory.mktemp("wake") / "store"
    ingest([NETLAB / "a2a_1gbit_5ms"], Options(store, job="a2a"))
    return tracetool.connect(store)


def test_each_synchronous_all_to_all_op_ends_after_its_own_span(
        con: duckdb.DuckDBPyConnection) -> None:
    # independent: the ops that enqueued an all-to-all, and the span of that very call
    expected = set(con.execute("""
        SELECT op.rank, op.eid, c.gloo_eid FROM events op
        JOIN events call ON call.rank = op.rank AND call.parent_eid = op.eid
                        AND call.name = 'c10d::alltoall_base_'
        JOIN collectives c ON c.rank = call.rank AND c.eid = call.eid
        WHERE op.name IN ('AllToAll', 'AllToAllBackward')""").fetchall())
    assert len(expected) == 96  # 4 ranks x 6 steps x (2 forward + 2 backward)
    got = con.execute("""
        SELECT rank, dst_eid, src_eid, src_point, lag_ns FROM rank_edges
        WHERE kind = 'transfer_wake' AND dst_point = 'end'""").fetchall()
    assert {(r, d, s) for r, d, s, _, _ in got} == expected
    assert {p for _, _, _, p, _ in got} == {"end"}
    # the op ended after its span did, typically by a thread wake-up (two ranks per core
    # wake some threads a few ms late)
    lags = sorted(lag for *_, lag in got)
    assert lags[0] >= 0 and lags[len(lags) // 2] < 200_000, lags
