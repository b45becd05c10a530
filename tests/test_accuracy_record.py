"""The constants fitted on the netlab ground truth and the accuracy figures measured out of
sample with them (benchmarks/accuracy_record.json, written by benchmarks/replay_accuracy.py)
stay together: changing SHARED_FILL, a network band term, or the data they were fitted on
without re-running the benchmark fails here. One leave-one-family-out rotation is replayed
again (the cheapest: the family with the fewest settings) and must give the recorded
out-of-sample errors and band coverage."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tracetool.replay import band, transport
from tracetool.replay.band import ERRORS, NETWORK_TERMS, fit_network_terms, using_terms
from tracetool.replay.transport import fit_shared_fill, host_rate, shared_fill

from ._util import REPO

RECORD = REPO / "benchmarks" / "accuracy_record.json"


def _benchmark() -> ModuleType:
    """benchmarks/replay_accuracy.py, imported by path (benchmarks/ is no package)."""
    name = "replay_accuracy"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it loads
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def test_record_is_of_the_live_constants_and_data(record: dict) -> None:
    """A fitted constant moved, or the ground truth changed, and the out-of-sample figures
    were not re-run: re-run ``python benchmarks/replay_accuracy.py`` (it rewrites the
    record) and update README.md / BENCHMARKS.md from its output."""
    ra = _benchmark()
    live = ra.live_constants()
    assert record["constants"] == live, "re-run benchmarks/replay_accuracy.py"
    now = ra.fingerprint(live)
    assert record["hash"] == now, "re-run benchmarks/replay_accuracy.py"
    # the record's constants are its own refit (the code was updated to the fit)
    assert record["stale"] == [] and record["refit"] == live


def test_fingerprint_moves_with_a_constant_or_the_data(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ra = _benchmark()
    base = ra.fingerprint()
    with shared_fill(transport.SHARED_FILL + 0.05):
        assert ra.fingerprint()["constants"] != base["constants"]
    with using_terms({"net_latency": ERRORS["net_latency"].e + 0.01}):
        assert ra.fingerprint()["constants"] != base["constants"]
    with host_rate(transport.GLOO_HOST_RATE + 5e7):
        assert ra.fingerprint()["constants"] != base["constants"]
    assert ra.fingerprint() == base
    validation = tmp_path / "validation.json"  # a held-out list is part of the data
    validation.write_text('{"held_out": ["1gbit"]}')
    monkeypatch.setattr(ra, "VALIDATION", validation)
    moved = ra.fingerprint()
    assert moved["data"] != base["data"] and moved["constants"] == base["constants"]


def test_fit_shared_fill_is_minimax_then_smallest() -> None:
    # least worst error wins, not the least total: 0.2 has the lower sum elsewhere
    assert fit_shared_fill({0.0: 0.30, 0.2: 0.12, 0.35: 0.09, 0.5: 0.146}) == 0.35
    assert fit_shared_fill({0.0: 0.05, 0.1: 0.05, 0.2: 0.07}) == 0.0  # a tie: the smallest
    assert fit_shared_fill({}) == 0.0  # nothing to fit on: no fitted effect


def test_fit_network_terms_from_ratio_errors() -> None:
    cases = [(("net_bandwidth", "net_latency"), 109.98, 100.0),  # 9.98% -> 0.10
             (("net_latency",), 90.0, 100.0),  # 100/90: 11.1% -> 0.12
             (("net_bandwidth", "kernel_small"), 104.0, 100.0)]
    assert fit_network_terms(cases) == {"net_bandwidth": 0.10, "net_latency": 0.12,
                                        "net_all_to_all": 0.12,  # unused: the widest
                                        "net_host": 0.12}
    assert fit_network_terms([]) == {t: ERRORS[t].e for t in NETWORK_TERMS}
    assert band.ratio_error(50.0, 100.0) == band.ratio_error(200.0, 100.0) == 1.0


def test_overrides_restore_and_refuse() -> None:
    fill, e = transport.SHARED_FILL, ERRORS["net_bandwidth"]
    with shared_fill(0.6), using_terms({"net_bandwidth": 0.5}):
        assert transport.SHARED_FILL == 0.6 and ERRORS["net_bandwidth"].e == 0.5
    assert transport.SHARED_FILL == fill and ERRORS["net_bandwidth"] is e
    with pytest.raises(ValueError, match="shared fill 1.5 outside"):
        with shared_fill(1.5):
            pass
    rate = transport.GLOO_HOST_RATE
    with host_rate(1e8):
        assert transport.GLOO_HOST_RATE == 1e8
    assert transport.GLOO_HOST_RATE == rate
    with pytest.raises(ValueError, match="host rate 0 not > 0"):
        with host_rate(0):
            pass
    with pytest.raises(ValueError, match="unknown band terms: net_typo"):
        with using_terms({"net_typo": 0.1}):
            pass


def test_families_and_held_out_settings(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Families are make_netlab.py's jobs (pattern, world size); validation.json holds out
    settings and whole jobs by those names."""
    ra = _benchmark()
    settings = {"a": {"pattern": "ddp_allreduce", "world_size": 2},
                "b": {"pattern": "ddp_one_bucket", "world_size": 2},
                "c": {"pattern": "ddp_allreduce", "world_size": 2},
                "d": {"pattern": "ddp_allreduce", "world_size": 8},
                "e": {"pattern": "ddp_allreduce", "world_size": 8}}
    assert ra.netlab_families(settings) == {"ddp_allreduce, 2 ranks": ["a", "c"],
                                            "ddp_one_bucket, 2 ranks": ["b"],
                                            "ddp_allreduce, 8 ranks": ["d", "e"]}
    f = tmp_path / "validation.json"
    monkeypatch.setattr(ra, "VALIDATION", f)
    assert ra.validation_settings(settings) == ([], [])
    f.write_text(json.dumps({"seed": 2728, "held_out_jobs": ["ddp_allreduce, 8 ranks"],
                             "held_out_settings": ["c", "d"]}))
    assert ra.validation_settings(settings) == (["c", "d", "e"], [])
    f.write_text('["b"]')
    assert ra.validation_settings(settings) == (["b"], [])
    # chosen before the capture: names not measured yet are reported, not fitted on
    f.write_text('{"held_out_settings": ["zz", "a"], "held_out_jobs": ["pipeline, 4 ranks"]}')
    assert ra.validation_settings(settings) == (["a"], ["zz", "job 'pipeline, 4 ranks'"])
    f.write_text('{"seed": 1}')
    with pytest.raises(SystemExit, match="no held_out_settings or held_out_jobs"):
        ra.validation_settings(settings)


def test_a_rotation_out_of_sample_is_reproduced(record: dict,
                                                tmp_path_factory: pytest.TempPathFactory
                                                ) -> None:
    """The cheapest rotation (the held-out family with the fewest fit pairs), from the source
    it projected worst: its trace ingested and projected onto the family's other settings
    with the SHARED_FILL, GLOO_HOST_RATE and band terms fitted without that family (as
    recorded) gives the recorded out-of-sample errors, and the band covers the measured step
    in every case (the goal of issue 27). The truth is the record's (its data's hash is
    checked above)."""
    ra = _benchmark()
    families, rotations = record["families"], record["out_of_sample"]
    family = min(rotations, key=lambda f: (rotations[f]["pairs"], len(families[f]), f))
    rot = rotations[family]
    src = max(rot["cases"], key=lambda c: abs(c["error"]))["src"]
    cases = [c for c in rot["cases"] if c["src"] == src]
    lab = ra.Netlab(tmp_path_factory.mktemp("rotation") / "store", ra.load_settings(), [src],
                    truth={n: 1e6 * t for n, t in record["truth_ms"].items()})
    with shared_fill(rot["SHARED_FILL"]), host_rate(rot["GLOO_HOST_RATE"]), \
            using_terms(rot["terms"]):
        pairs = [lab.project(family, src, c["dst"]) for c in cases]
    assert len(pairs) >= 1
    for p, c in zip(pairs, cases, strict=True):
        assert p.error == pytest.approx(c["error"], abs=2e-6), (p.src, p.dst)
        assert p.width == pytest.approx(c["width"], abs=2e-6), (p.src, p.dst)  # its terms
        assert p.covered == c["covered"], (p.src, p.dst)
    # the cheapest rotation is the one-bucket job's (2 pairs), whose band misses both: the
    # goal of issue 27 (every out-of-sample case covered) is not met there (below)
    assert [p.covered for p in pairs] == [False], [(p.dst, p.error, p.low, p.high)
                                               for p in pairs]


# Out-of-sample band coverage per job family as benchmarks/accuracy_record.json holds it
# (leave one family out; pairs of fit settings): covered, pairs. The goal of issue 27 is
# every pair covered; asserted as measured so that neither a regression nor an improvement
# goes unseen. The one-bucket job (one 16.8 MB message across +5 ms: slow start and the
# window over the whole message, 23.2%) and the small model on 2 threads (steps whose DDP
# wait the graph does not link to the transfer; GLOO_HOST_RATE fitted without it at 300
# MB/s) miss.
OUT_OF_SAMPLE_COVERAGE = {"ddp_allreduce, 2 ranks": (90, 90), "ddp_allreduce, 4 ranks": (6, 6),
                          "moe_all_to_all, 4 ranks": (12, 12),
                          "ddp_one_bucket, 2 ranks": (0, 2),
                          "ddp_small_buckets, 2 ranks": (2, 2),
                          "ddp_small_model_2threads, 2 ranks": (0, 2)}


def test_out_of_sample_coverage(record: dict) -> None:
    got = {f: (r["covered"], r["pairs"]) for f, r in record["out_of_sample"].items()}
    assert got == OUT_OF_SAMPLE_COVERAGE
    a = record["all"]["out_of_sample"]
    assert (a["covered"], a["pairs"]) == (110, 114)


def test_a_pair_the_replay_cannot_project_is_a_named_miss() -> None:
    ra = _benchmark()
    nan = float("nan")
    pairs = [ra.Pair("f", "a", "b", 110.0, 100.0, 95.0, 120.0),
             ra.Pair("f", "b", "a", 80.0, 100.0, 70.0, 90.0),
             ra.Pair("f", "a", "c", nan, 100.0, nan, nan, (), "ValueError: no collective")]
    s = ra.summary(pairs)
    assert s == {"pairs": 3, "worst": 0.2, "worst_pair": "b -> a", "mean_width": 0.225,
                 "covered": 1, "failed": ["a -> c: ValueError: no collective"]}
    assert ra._abs_error(nan, 100.0) == float("inf")  # a fit never prefers a failing value


def test_fit_host_cpu_is_the_worst_host_ratio() -> None:
    # the bert-small and Qwen pairs' CPU time per step, ms (benchmarks/replay_accuracy.py)
    assert band.fit_host_cpu([(9.679, 8.761), (83.234, 77.197)]) == 0.11  # 10.48% up
    assert band.fit_host_cpu([(639.944, 686.634)]) == 0.08  # 7.30%, the ratio either way
    assert band.fit_host_cpu([]) == ERRORS["host_cpu"].e
