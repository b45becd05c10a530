"""Network what-ifs that change nothing are refused, and a --network beside a source network
scaled to the gradients keeps that scaling (issue 26, items 4 and 8, audited on the corpus):

* MTIA (no collective): --network and a sweep axis are refused as changing nothing, without
  first asking for a --source-network that could not change that;
* a --network whose every setting is the source network's is refused (it projected the BERT
  DDP pair -20.7%: the unset keys came from the unscaled default network, while the source
  was scaled by 0.00454x to carry the gradients);
* a sweep value equal to the source's is that axis's baseline row, the measured time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ._util import SHARED_TRACES, run

MTIA = SHARED_TRACES / ("facebookresearch__HolisticTraceAnalysis/tests/data/"
                        "mtia_inference_trace/mtia_inference_rank_0.json.gz")
BERT_DDP = SHARED_TRACES / ("gaoteng-git__kineto/tb_plugin/test/data/tracing/"
                            "bert_newAPI_fp16_ddp")
pytestmark = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="no trace corpus")


@pytest.fixture(scope="module")
def mtia(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("mtia") / "s"
    assert run("ingest", "--store", store, "--job", "m", MTIA)[0] == 0
    return store


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("bert") / "s"
    assert run("ingest", "--store", store, "--job", "b",
               *sorted(BERT_DDP.glob("worker*.json.gz")))[0] == 0
    return store


def test_mtia_network_what_ifs_are_refused_as_changing_nothing(mtia: Path,
                                                              tmp_path: Path) -> None:
    line = ("tracetool: error: the network changes nothing: job m has no collective across "
            "ranks that the network model prices\n")
    assert run("replay", mtia, "--network", "gpus_per_node=1") == (2, "", line)
    code, out, err = run("sweep", mtia, "--network", "inter_node_bw=1,10Gbit/s",
                         "--out", tmp_path / "sw")
    assert (code, err) == (2, f"tracetool: error: sweep axis inter_node_bw: {line[18:]}")
    # --gpu: no catalog entry for its device
    code, _, err = run("replay", mtia, "--gpu", "h100")
    assert code == 2 and err == (
        "tracetool: error: GPU 'H100 SXM': job m ran on ARTEMIS, which has no entry in the "
        "GPU catalog, so its ops cannot be projected onto another GPU (give --source-gpu to "
        "take it as one of the catalog's)\n")


def test_a_network_equal_to_the_source_is_refused(bert: Path, tmp_path: Path) -> None:
    assert run("replay", bert, "--source-gpu", "v100", "--network", "gpus_per_node=8") == (
        2, "", "tracetool: error: the network changes nothing for job b: every setting of it "
               "is the source network's\n")
    code, _, err = run("sweep", bert, "--source-gpu", "v100", "--network", "gpus_per_node=8",
                       "--out", tmp_path / "sw")
    assert (code, err) == (2, "tracetool: error: sweep axis gpus_per_node: the network "
                              "changes nothing for job b: every value of it is the source "
                              "network's\n")


def _change(store: Path, *args: str) -> list[float]:
    code, out, err = run("replay", store, "--json", "--source-gpu", "v100", *args)
    assert code == 0, err
    return [s["error"] for s in json.loads(out)["steps"]]


def test_network_keys_left_unset_follow_the_scaled_source(bert: Path) -> None:
    """A latency 1 us above the source's moves the steps by microseconds, not -20%."""
    changes = _change(bert, "--network", "intra_node_latency=6us")
    assert len(changes) == 2 and all(0 < c < 1e-3 for c in changes)


def test_a_sweep_value_equal_to_the_source_is_the_measured_time(bert: Path,
                                                                tmp_path: Path) -> None:
    code, out, err = run("sweep", bert, "--source-gpu", "v100", "--network",
                         "gpus_per_node=1,8", "--out", tmp_path / "sw", "--json")
    assert code == 0, err
    rows = {r["setting"]: r for r in json.loads(out)["rows"]}
    assert rows["gpus_per_node=8"]["projected_step_ns"] == rows[
        "gpus_per_node=8"]["measured_step_ns"]
    assert rows["gpus_per_node=1"]["projected_step_ns"] > 2 * rows[
        "gpus_per_node=1"]["measured_step_ns"]
