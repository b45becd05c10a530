"""What-if inputs that would change nothing are errors (exit 2, one line): unknown --speedup
categories, categories and patterns matching no GPU op of the job, --gpu / --source-gpu not in
the catalog. The real CLI, on the gloo sample (a CPU job) and the 8-rank DLRM V100 trace."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tracetool.hardware import catalog, catalog_help, describe_catalog, lookup_gpu
from tracetool.replay.compute import (
    CATEGORIES,
    COMPUTE_BOUND,
    KERNEL_CATEGORIES,
    NON_KERNEL_KINDS,
    WhatIfError,
    parse_speedup,
)

from ._util import run
from .conftest import TRACES_DIR

REPO = Path(__file__).resolve().parents[1]
TRACETOOL = REPO / ".venv" / "bin" / "tracetool"
DLRM = TRACES_DIR / "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto"
GLOO_NET = "gpus_per_node=1,inter_node_bw=1Gbit/s"
KNOWN = ", ".join(CATEGORIES)
GPUS = describe_catalog()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store: job nl (the 2-rank gloo sample under 1 Gbit/s) and, with the shared
    corpus, job dlrm (8 ranks, V100)."""
    path = tmp_path_factory.mktemp("whatif") / "store"
    code, _, err = run("ingest", REPO / "sample_traces/netlab/bw_1gbit", "--store", path,
                       "--job", "nl")
    assert code == 0, err
    if DLRM.is_dir():
        code, _, err = run("ingest", DLRM, "--store", path, "--job", "dlrm")
        assert code == 0, err
    return path


@pytest.fixture(scope="module")
def dlrm(store: Path) -> Path:
    if not DLRM.is_dir():
        pytest.skip(f"real trace corpus not found at {TRACES_DIR}")
    return store


def one_error(code: int, stdout: str, stderr: str, message: str) -> None:
    """Exit 2, nothing on stdout, exactly ``tracetool: error: <message>`` on stderr."""
    assert (code, stdout, stderr) == (2, "", f"tracetool: error: {message}\n")


def replay_json(store: Path, *args: str) -> dict:
    code, stdout, stderr = run("replay", store, "--job", "dlrm", "--json", *args)
    assert code == 0, stderr
    return json.loads(stdout)


# -- one list of categories -------------------------------------------------------------------

def test_known_categories_are_the_ones_the_kernels_view_produces() -> None:
    sql = (REPO / "analysis/sql/10_ops.sql").read_text()
    view = re.search(r"CREATE (?:OR REPLACE )?VIEW kernels\b(.*?);", sql, re.S).group(1)
    view = re.sub(r"--[^\n]*", "", view)  # comments
    produced = re.findall(r"\b(?:THEN|ELSE)\s+'([a-z_]+)'", view)
    assert sorted(set(produced)) == sorted(KERNEL_CATEGORIES)
    assert set(COMPUTE_BOUND) <= set(KERNEL_CATEGORIES)
    assert CATEGORIES == KERNEL_CATEGORIES + NON_KERNEL_KINDS
    assert "kernel" not in NON_KERNEL_KINDS  # kernels always get a kernels.category


def test_speedup_categories_are_case_insensitive_and_checked() -> None:
    for text in ("gemm=2", "GEMM=2", " Gemm =2"):
        s = parse_speedup(text)
        assert (s.category, s.pattern, s.factor, str(s)) == ("gemm", None, 2.0, text)
    assert parse_speedup("memcpy=1.5").category == "memcpy"
    assert parse_speedup("name~a=b=2").pattern.pattern == "a=b"  # the factor is after the last =
    with pytest.raises(WhatIfError) as err:
        parse_speedup("gem=2")
    assert str(err.value) == (f"bad speedup 'gem=2': unknown category 'gem'; known: {KNOWN} "
                              "(or name~REGEX=FACTOR)")
    for bad in ("NAME~x=2", "gemm=inf", "gemm=nan"):
        with pytest.raises(WhatIfError, match="bad speedup"):
            parse_speedup(bad)


# -- the GPU catalog: exact names only --------------------------------------------------------

def test_user_gpu_names_are_exact_and_unambiguous() -> None:
    gpus = catalog()
    names: dict[str, str] = {}
    for g in gpus.values():
        for n in {g.key, g.name, *g.match}:
            assert names.setdefault(n.lower(), g.key) == g.key, n  # one GPU per name
            for spelled in (n, n.upper(), n.lower(), f" {n} "):
                assert lookup_gpu(spelled).key == g.key
    assert lookup_gpu("H100 SXM").key == "h100" and lookup_gpu("mi250").key == "mi250x"
    # near misses and trace device names are not catalog names (find_gpu maps the latter)
    for miss in ("h100x", "a100-40gb", "NVIDIA H100 80GB HBM3", "h10", "", "tpu9"):
        assert lookup_gpu(miss) is None, miss


def test_gpu_help_is_built_from_the_catalog() -> None:
    gpus = catalog()
    text = catalog_help()
    assert all(k in text for k in gpus) and gpus["a100"].name in text
    fake = {"zz1": gpus["h100"]}
    assert catalog_help(fake) == "a catalog key (zz1) or name (e.g. 'H100 SXM'), case-insensitive"
    for command in ("replay", "sweep"):
        code, stdout, _ = run(command, "--help")
        flat = " ".join(stdout.split())
        assert code == 0 and text in flat, command
        assert "--source-gpu TEXT GPU the trace ran on: " + text in flat


# -- the CLI, on a CPU (gloo) job: no GPU ops at all ------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--speedup", "gem=2"], f"bad speedup 'gem=2': unknown category 'gem'; known: {KNOWN} "
                             "(or name~REGEX=FACTOR)"),
    (["--speedup", "gemm"], "bad speedup 'gemm': use CATEGORY=FACTOR or name~REGEX=FACTOR "
                            "with FACTOR from 0.001 to 1000 (e.g. gemm=1.5, name~flash=2)"),
    (["--speedup", "gemm=1"], "bad speedup 'gemm=1': a factor of 1 changes nothing"),
    (["--speedup", "GEMM=2"], "speedup 'GEMM=2': job nl has no GPU op of category 'gemm' "
                              "(it has no GPU ops)"),
    (["--speedup", "name~zzz=2"], "speedup 'name~zzz=2': the pattern 'zzz' matches no GPU op "
                                  "of job nl"),
    (["--gpu", "h100x"], f"--gpu: unknown GPU 'h100x'; give a catalog key or name "
                         f"(case-insensitive): {GPUS}"),
    (["--gpu", "a100-40gb"], f"--gpu: unknown GPU 'a100-40gb'; give a catalog key or name "
                             f"(case-insensitive): {GPUS}"),
    (["--source-gpu", "V100x", "--gpu", "h100"],
     f"--source-gpu: unknown GPU 'V100x'; give a catalog key or name (case-insensitive): "
     f"{GPUS}"),
])
def test_replay_rejects_inputs_that_change_nothing(store: Path, args: list[str],
                                                   message: str) -> None:
    one_error(*run("replay", store, "--job", "nl", "--source-network", GLOO_NET, *args),
              message)


def test_what_if_errors_come_before_store_errors(tmp_path: Path) -> None:
    # a usage error is reported as such even when the store is bad too (exit 1 alone)
    code, _, stderr = run("replay", tmp_path / "nothing", "--gpu", "h100")
    assert code == 1 and stderr.count("\n") == 1
    one_error(*run("replay", tmp_path / "nothing", "--gpu", "h100x"),
              f"--gpu: unknown GPU 'h100x'; give a catalog key or name (case-insensitive): "
              f"{GPUS}")


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu", "v100,h100x"], f"--gpu: unknown GPU 'h100x'; give a catalog key or name "
                              f"(case-insensitive): {GPUS}"),
    (["--network", "inter_node_bw=1,2Gbit/s", "--speedup", "gem=2"],
     f"bad speedup 'gem=2': unknown category 'gem'; known: {KNOWN} (or name~REGEX=FACTOR)"),
    (["--network", "inter_node_bw=1,2Gbit/s", "--speedup", "name~zzz=2"],
     "speedup 'name~zzz=2': the pattern 'zzz' matches no GPU op of job nl"),
])
def test_sweep_rejects_inputs_that_change_nothing(store: Path, tmp_path: Path,
                                                  args: list[str], message: str) -> None:
    one_error(*run("sweep", store, "--job", "nl", "--source-network", GLOO_NET, "--out",
                   tmp_path / "sw", *args), message)
    assert not (tmp_path / "sw").exists()


# -- the CLI, on a GPU job (DLRM, 8 x V100) ---------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--speedup", "conv=2"], "speedup 'conv=2': job dlrm has no GPU op of category 'conv'"),
    (["--speedup", "gemm=2", "--speedup", "name~flash=2"],
     "speedup 'name~flash=2': the pattern 'flash' matches no GPU op of job dlrm"),
    (["--speedup", "comm=2"], "speedup 'comm=2': every GPU op of job dlrm it matches is a "
                              "collective transfer, which the network model prices (use "
                              "--network)"),
    (["--gpu", "NVIDIA H100 80GB HBM3"],
     f"--gpu: unknown GPU 'NVIDIA H100 80GB HBM3'; give a catalog key or name "
     f"(case-insensitive): {GPUS}"),
])
def test_replay_rejects_no_ops_on_a_gpu_job(dlrm: Path, args: list[str], message: str) -> None:
    one_error(*run("replay", dlrm, "--job", "dlrm", *args), message)


def test_valid_speedups_change_the_projection(dlrm: Path) -> None:
    identity = replay_json(dlrm)["steps"][0]
    gemm = replay_json(dlrm, "--speedup", "gemm=1.5")["steps"][0]
    upper = replay_json(dlrm, "--speedup", "GEMM=1.5")["steps"][0]
    emb = replay_json(dlrm, "--speedup", "name~split_embedding=2")["steps"][0]
    assert upper == gemm  # GEMM is gemm
    for s in (gemm, emb):
        assert s["projected_breakdown_ns"] != identity["projected_breakdown_ns"]
        assert (s["projected_breakdown_ns"]["compute"]
                < identity["projected_breakdown_ns"]["compute"])


def test_valid_gpus_change_the_projection(dlrm: Path, tmp_path: Path) -> None:
    identity = replay_json(dlrm)["steps"][0]
    h100 = replay_json(dlrm, "--gpu", "h100")
    assert h100["scenario"] == "gpu=h100"
    by_name = replay_json(dlrm, "--gpu", "h100 sxm")
    assert by_name["steps"] == h100["steps"]
    assert h100["steps"][0]["projected_step_ns"] != identity["projected_step_ns"]
    # onto itself: a --gpu that changes nothing is refused (in a sweep, it is the baseline)
    code, stdout, stderr = run("replay", dlrm, "--job", "dlrm", "--gpu", "V100",
                               "--source-gpu", "v100 sxm2")
    assert (code, stdout) == (2, "")
    assert stderr == ("tracetool: error: GPU 'V100 SXM2': job dlrm ran on it already, so --gpu "
                      "changes nothing: give another GPU, or --gpu-clock / --power-cap for "
                      "this one\n")
    code, stdout, stderr = run("sweep", dlrm, "--job", "dlrm", "--gpu", "v100,H100 SXM",
                               "--out", tmp_path / "sw", "--json")
    assert code == 0, stderr
    rows = json.loads(stdout)["rows"]
    assert [r["setting"] for r in rows] == ["gpu=v100", "gpu=H100 SXM"]
    assert rows[1]["projected_step_ns"] == h100["steps"][0]["projected_step_ns"]


def test_subprocess_exit_code_and_one_line(dlrm: Path) -> None:
    for args, message in (
        (["--gpu", "a100-40gb"], f"--gpu: unknown GPU 'a100-40gb'; give a catalog key or "
                                 f"name (case-insensitive): {GPUS}"),
        (["--speedup", "name~zzz=2"], "speedup 'name~zzz=2': the pattern 'zzz' matches no GPU "
                                      "op of job dlrm"),
    ):
        p = subprocess.run([str(TRACETOOL), "replay", str(dlrm), "--job", "dlrm", *args],
                           capture_output=True, text=True, check=False)
        assert (p.returncode, p.stdout, p.stderr) == (2, "", f"tracetool: error: {message}\n")
    p = subprocess.run([str(TRACETOOL), "replay", str(dlrm), "--job", "dlrm", "--speedup",
                        "gemm=1.5"], capture_output=True, text=True, check=False)
    assert p.returncode == 0 and "scenario: speedup gemm=1.5" in p.stdout, p.stderr


def test_readme_lists_the_catalog_and_the_categories() -> None:
    text = " ".join((REPO / "README.md").read_text().split())
    keys = ", ".join(f"`{k}`" for k in catalog())
    assert f"take a catalog key ({keys}:" in text
    assert f"of a category ({', '.join(CATEGORIES)};" in text


def test_a_gpu_on_a_cpu_job_is_an_error_in_replay_and_sweep(store: Path) -> None:
    msg = ("GPU 'H100 SXM': job nl has no GPU ops (a CPU job), so a GPU changes nothing; "
           "change its network instead")
    one_error(*run("replay", store, "--job", "nl", "--source-gpu", "v100", "--gpu", "h100",
                   "--source-network", GLOO_NET), msg)
    code, _, err = run("sweep", store, "--job", "nl", "--source-network", GLOO_NET,
                       "--gpu", "h100", "--out", store.parent / "sweep")
    assert (code, err) == (2, f"tracetool: error: {msg}\n")


def test_the_python_api_refuses_what_ifs_that_change_nothing(store: Path) -> None:
    """The same checks hold without the CLI: they live where the weights are computed."""
    import tracetool
    from tracetool.replay import Replayer, Scenario, resolve_gpu

    r = Replayer.from_store(tracetool.connect(store), "nl")
    with pytest.raises(WhatIfError, match=r"speedup 'gemm=2': job nl has no GPU op of "
                                          r"category 'gemm' \(it has no GPU ops\)"):
        r.run(Scenario(speedups=(parse_speedup("gemm=2"),)))
    with pytest.raises(WhatIfError, match="job nl has no GPU ops"):
        r.run(Scenario(gpu=resolve_gpu("h100")))
    steps = r.run(Scenario()).steps  # the identity still runs, exactly
    assert steps and all(s.projected_ns == s.measured_ns for s in steps)
