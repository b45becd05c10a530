"""The replay graph's (rank, eid) -> slot index (replay/graph.py SlotIndex) for a bounded
selection: its lookup table and its binary search agree with a plain dict on random queries,
hits and misses, ranks outside the index included."""

from __future__ import annotations

import numpy as np
import pytest

from tracetool.replay.graph import SlotIndex


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("span_factor", [SlotIndex.SPAN_FACTOR, 0])  # table, binary search
def test_bounded_lookups_match_a_dict(seed: int, span_factor: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SlotIndex, "SPAN_FACTOR", span_factor)
    rng = np.random.default_rng(seed)
    ranks = rng.choice([0, 3, 7, 1023], size=3000)
    eids = rng.integers(0, 1_500, 3000) + ranks * 7  # dense enough for the table
    pairs = sorted(set(zip(ranks.tolist(), eids.tolist(), strict=True)))
    rank = np.array([r for r, _ in pairs])
    eid = np.array([e for _, e in pairs])
    order = rng.permutation(len(pairs))
    index = SlotIndex(rank[order], eid[order], dense=False)
    assert (index._span is None) == (span_factor == 0 and len(pairs) > 0)
    want = {p: i for i, p in enumerate(pairs)}  # slots: the selection in (rank, eid) order
    q_rank = np.concatenate([rank, rng.choice([0, 1, 3, 7, 1023, 2000, -1], 4000)])
    q_eid = np.concatenate([eid, rng.integers(-5, 10_000, 4000)])
    got = index(q_rank, q_eid)
    expect = [want.get((r, e), -1) for r, e in zip(q_rank.tolist(), q_eid.tolist(),
                                                    strict=True)]
    assert got.tolist() == expect
    assert index.n == len(pairs)
