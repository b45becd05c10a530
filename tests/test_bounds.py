"""Every numeric option is bounded before use (issue 32, item 2 and the numbers of item 8):
ranks, steps, --dp-scale, --workers, network and GPU values are checked where the options
are defined or right after the job is opened, before the graph is built, and a bad one is
one line and exit 2. The real CLI on the 2-rank gloo sample, plus a property test driving
every command's numeric options with extreme values under a memory and a time limit."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracetool.cli import cli
from tracetool.errors import InputError
from tracetool.ingest.workers import WORKERS_PER_CORE, capped_workers
from tracetool.replay.compute import WhatIfError, parse_speedup
from tracetool.replay.graph import RankRanges, parse_ranks, parse_steps
from tracetool.replay.model import MAX_GLOO_WORLD, check_dp_scale
from tracetool.replay.network import MAX_WORLD, Network, parse_network, parse_spec
from tracetool.replay.sweep import parse_axes, parse_axis
from tracetool.schema import MAX_RANK, MAX_STEP

from ._util import SAMPLES, run

JOB = "ddp_gloo_2rank"
NET = "gpus_per_node=1,inter_node_bw=1Gbit/s"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bounds") / "store"
    code, _, err = run("ingest", SAMPLES, "--store", path, "--workers", "1")
    assert code == 0, err
    return path


def one_error(result: tuple[int, str, str], message: str) -> None:
    """Exit 2, nothing on stdout, exactly ``tracetool: error: <message>`` on stderr."""
    assert result == (2, "", f"tracetool: error: {message}\n")


# -- ranks and steps: ranges are never expanded, numbers within the store's types ------------

def test_rank_ranges_are_kept_as_ranges_and_checked_against_the_job() -> None:
    assert parse_ranks("7-9, 0,2-3,3") == RankRanges(((0, 0), (2, 3), (7, 9)))
    assert parse_ranks("0-2147483647") == RankRanges(((0, MAX_RANK),))
    inside, missing = parse_ranks("0-10,20-99999").pick([0, 1, 5, 10, 20, 30])
    assert inside == (0, 1, 5, 10, 20, 30)
    assert missing == [(2, 4), (6, 9), (21, 29), (31, 99999)]
    with pytest.raises(InputError, match=r"^bad --ranks '0-99999999999': ranks are 0 to "
                                         r"2147483647$"):
        parse_ranks("0-99999999999")
    with pytest.raises(InputError, match=r"^bad --steps '0:9223372036854775808': ProfilerStep "
                                         r"numbers are 0 to 9223372036854775807$"):
        parse_steps(f"0:{MAX_STEP + 1}")
    with pytest.raises(InputError, match="ProfilerStep numbers are 0 to"):
        parse_steps("-3:-1")
    assert parse_steps(f"2:{MAX_STEP}") == (2, MAX_STEP)


def test_huge_rank_and_step_ranges_cost_nothing(store: Path) -> None:
    one_error(run("replay", store, "--source-network", NET, "--ranks", "0-99999999999"),
              "bad --ranks '0-99999999999': ranks are 0 to 2147483647")
    # within the store's range, 2^31 ranks: checked as ranges against the job's two
    one_error(run("replay", store, "--source-network", NET, "--ranks", "0-2147483647"),
              f"--ranks: job {JOB} has no rank 2-2147483647 (ranks: 0-1)")
    one_error(run("replay", store, "--source-network", NET, "--ranks", "1,5,7-9"),
              f"--ranks: job {JOB} has no rank 5, 7-9 (ranks: 0-1)")
    for command in ("replay", "critical-path"):
        one_error(run(command, store, "--source-network", NET, f"--step={2**63}")
                  if command == "replay" else run(command, store, f"--step={2**63}"),
                  f"Invalid value for '--step': {2**63} is not in the range "
                  f"0<=x<={MAX_STEP}.")
        one_error(run(command, store, *(["--source-network", NET] if command == "replay"
                                         else []), "--step", "99"),
                  f"{store}: job {JOB} has no {'complete ' if command == 'replay' else ''}"
                  "ProfilerStep#99")
    one_error(run("report", store, "--instance=-1", "--out", store.parent / "rep"),
              "Invalid value for '--instance': -1 is not in the range "
              f"0<=x<={MAX_STEP}.")


def test_a_rank_range_bomb_in_a_real_process_under_a_memory_limit(store: Path) -> None:
    """The issue's reproducer (killed by the kernel after 59 s): now one line at once, in
    1 GiB of address space more than the interpreter's start needs."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    p = subprocess.run([sys.executable, "-m", "tracetool", "replay", str(store),
                        "--source-network", NET, "--ranks", "0-2147483647"],
                       capture_output=True, text=True, check=False, timeout=60,
                       preexec_fn=limit)
    assert (p.returncode, p.stderr) == (2, f"tracetool: error: --ranks: job {JOB} has no rank "
                                           "2-2147483647 (ranks: 0-1)\n")


# -- --dp-scale: the projected job is bounded --------------------------------------------------

def test_dp_scale_is_bounded_by_the_ranks_it_projects(store: Path) -> None:
    check_dp_scale(2, MAX_WORLD // 2)
    check_dp_scale(2, MAX_GLOO_WORLD // 2, gloo=True)
    with pytest.raises(WhatIfError, match=r"^--dp-scale 65537: give 1 to 65536: a job of 2 "
                                          r"ranks is projected onto at most 131072 ranks$"):
        check_dp_scale(2, MAX_WORLD // 2 + 1)
    one_error(run("replay", store, "--source-network", NET, "--dp-scale", str(10**12)),
              f"Invalid value for '--dp-scale': {10**12} is not in the range "
              f"1<=x<={MAX_WORLD}.")
    # needs the job: checked right after the store is opened (the job has 2 ranks)
    one_error(run("replay", store, "--source-network", NET, "--dp-scale", "100000"),
              "--dp-scale 100000: give 1 to 65536: a job of 2 ranks is projected onto at "
              "most 131072 ranks")
    # a CPU job's gloo ring is simulated segment by segment: a smaller bound
    gloo = ("--dp-scale 600: give 1 to 512: a CPU (gloo) job of 2 ranks is projected onto "
            "at most 1024 ranks")
    one_error(run("replay", store, "--source-network", NET, "--dp-scale", "600"), gloo)
    out = store.parent / "sweep"
    one_error(run("sweep", store, "--source-network", NET, "--dp-scale", "1,600", "--out",
                  out), gloo)
    one_error(run("sweep", store, "--source-network", NET, "--dp-scale", "1,1e400", "--out",
                  out), "bad --dp-scale '1,1e400': whole numbers 1 to 131072, comma-separated")
    one_error(run("sweep", store, "--source-network", NET, "--dp-scale", "2,2", "--out", out),
              "bad --dp-scale '2,2': a value is given twice")
    assert not out.exists()


# -- --workers: capped at a multiple of the cores, with a note ---------------------------------

def test_workers_are_capped_at_a_multiple_of_the_cores(tmp_path: Path) -> None:
    assert capped_workers(8, cores=2) == (8, None)
    assert capped_workers(100_000, cores=2) == (
        8, f"--workers 100000: capped at 8 ({WORKERS_PER_CORE} per core on 2 cores)")
    cap, note = capped_workers(100_000)
    code, out, err = run("ingest", SAMPLES, "--store", tmp_path / "s", "--workers", "100000")
    assert code == 0 and out.count("ingested ") == 2, err
    assert err == f"tracetool: warning: {note}\n" and str(cap) in note
    one_error(run("ingest", SAMPLES, "--store", tmp_path / "s", "--workers", "0"),
              "Invalid value for '--workers': 0 is not in the range x>=1.")
    one_error(run("ingest", SAMPLES, "--store", tmp_path / "s", "--workers", "1e400"),
              "Invalid value for '--workers': '1e400' is not a valid integer.")


# -- network values: finite, positive, within documented ranges, each key once ---------------

@pytest.mark.parametrize(("spec", "message"), [
    ("gpus_per_node=1e30", "bad gpus_per_node '1e30': give a whole number from 1 to 131072"),
    ("gpus_per_node=0", "bad gpus_per_node '0': give a whole number from 1 to 131072"),
    ("ranks_per_dc=131073", "bad ranks_per_dc '131073': give a whole number from 1 to 131072"),
    ("inter_node_bw=1e400Gbit/s", "inter_node_bw: bad bandwidth '1e400Gbit/s': give 1Mbit/s "
                                  "to 1Pbit/s, or inf"),
    ("inter_node_bw=0Gbit/s", "inter_node_bw: bad bandwidth '0Gbit/s': give 1Mbit/s to "
                              "1Pbit/s, or inf"),
    ("dc_bw=2Pbit/s", "dc_bw: bad bandwidth '2Pbit/s': give 1Mbit/s to 1Pbit/s, or inf"),
    ("dc_bw=fast", "dc_bw: bad bandwidth 'fast': use a number and a unit like 400Gbit/s, "
                   "50GB/s or 25Gbps"),
    ("intra_node_bw=999kbit/s", "intra_node_bw: bad bandwidth '999kbit/s': give 1Mbit/s to "
                                "1Pbit/s, or inf"),
    ("inter_node_latency=1e400s", "inter_node_latency: bad time '1e400s': give 0 to 10s"),
    ("dc_latency=11s", "dc_latency: bad time '11s': give 0 to 10s"),
    ("inter_node_bw=1Gbit/s,inter_node_bw=2Gbit/s",
     "network setting 'inter_node_bw' given twice in 'inter_node_bw=1Gbit/s,"
     "inter_node_bw=2Gbit/s'"),
    ("", "network spec '' sets nothing: give key=value,... (e.g. inter_node_bw=400Gbit/s) or "
         "a TOML file"),
    (" , ", "network spec ' , ' sets nothing: give key=value,... (e.g. "
            "inter_node_bw=400Gbit/s) or a TOML file"),
    ("# TOML\ngpus_per_node = 1e30\n",
     "bad gpus_per_node 1e+30: give a whole number from 1 to 131072"),
    ("# TOML\ngpus_per_node = true\n",
     "bad gpus_per_node True: give a whole number from 1 to 131072"),
    ("# TOML\ninter_node_bw = nan\n",
     "inter_node_bw: bad bandwidth nan: give 1Mbit/s to 1Pbit/s, or inf"),
    ("# TOML\ninter_node_latency = -1\n", "inter_node_latency: bad time -1: give 0 to 10s"),
])
def test_network_values_are_refused_in_one_line(store: Path, spec: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_spec(spec)
    assert str(err.value) == message
    one_error(run("replay", store, "--source-network", NET, "--network", spec), message)
    one_error(run("replay", store, "--source-network", spec), message)


def test_network_values_in_range_are_kept() -> None:
    net = parse_network("inter_node_bw=inf,intra_node_bw=1Mbit/s,dc_bw=1Pbit/s,"
                        "dc_latency=10s,inter_node_latency=0,gpus_per_node=131072")
    assert (net.inter_node_bw, net.intra_node_bw, net.dc_bw) == (float("inf"), 125e3, 1.25e14)
    assert (net.dc_latency, net.inter_node_latency, net.gpus_per_node) == (10.0, 0.0, MAX_WORLD)
    assert parse_network("# TOML\ninter_node_bw = 25e9\n") == Network(inter_node_bw=25e9)
    # the datacenter check needs the base, so it is parse_network's, not parse_spec's
    assert parse_spec("ranks_per_dc=4") == {"ranks_per_dc": 4}


def test_sweep_axes_are_checked_before_the_graph(store: Path) -> None:
    out = store.parent / "sweep"
    one_error(run("sweep", store, "--source-network", NET, "--network",
                  "gpus_per_node=1,inter_node_bw=1,10,100Gbit/s", "--out", out),
              "bad sweep axis 'gpus_per_node=1,inter_node_bw=1,10,100Gbit/s': one key per "
              "--network; give --network gpus_per_node=1 --network inter_node_bw=1,10,100Gbit/s")
    one_error(run("sweep", store, "--source-network", NET, "--network",
                  "inter_node_bw=1,0Gbit/s", "--out", out),
              "inter_node_bw: bad bandwidth '0Gbit/s': give 1Mbit/s to 1Pbit/s, or inf")
    one_error(run("sweep", store, "--source-network", NET, "--network", "inter_node_bw=1Gbit/s",
                  "--network", "inter_node_bw=2Gbit/s", "--out", out),
              "sweep axis 'inter_node_bw' given twice: give its values in one --network "
              "inter_node_bw=v1,v2,...")
    assert not out.exists()
    assert parse_axis("gpus_per_node=1,2,4") == ("gpus_per_node", ["1", "2", "4"])
    with pytest.raises(InputError, match="^bad gpus_per_node '2Gbit/s'"):
        parse_axes(["gpus_per_node=1,2Gbit/s"])
    with pytest.raises(InputError, match="a value is given twice"):
        parse_axis("inter_node_bw=1,1Gbit/s")


# -- GPU values ---------------------------------------------------------------------------------

def test_empty_gpu_and_network_options_are_refused(store: Path) -> None:
    unknown = "unknown GPU ''; give a catalog key or name (case-insensitive): "
    for option in ("--gpu", "--source-gpu"):
        code, out, err = run("replay", store, "--source-network", NET, option, "")
        assert (code, out) == (2, "") and err.startswith(f"tracetool: error: {option}: "
                                                         f"{unknown}")
    code, _, err = run("sweep", store, "--source-network", NET, "--gpu", "h100,",
                       "--out", store.parent / "sweep")
    assert code == 2 and err.startswith(f"tracetool: error: --gpu: {unknown}")


def test_speedup_factors_are_within_their_range() -> None:
    assert parse_speedup("gemm=1000").factor == 1000
    assert parse_speedup("name~flash=0.001").factor == 0.001
    for text in ("gemm=1e-300", "gemm=1001", "gemm=nan", "gemm=inf", "gemm=0", "gemm=-2"):
        with pytest.raises(WhatIfError, match=rf"^bad speedup '{text}': use CATEGORY=FACTOR "
                                              r"or name~REGEX=FACTOR with FACTOR from 0\.001 "
                                              r"to 1000 \(e\.g\. gemm=1\.5, name~flash=2\)$"):
            parse_speedup(text)


# -- every command's numeric options, extreme values, under a memory and a time limit ---------

class OverTime(BaseException):
    """Raised by ``bounded``'s alarm: a BaseException, which no error handler of the CLI
    turns into an ordinary error line (TimeoutError is an OSError, which they do)."""


@contextmanager
def bounded(seconds: int, extra_bytes: int = 3 << 30) -> Iterator[None]:
    """Run the body with at most ``extra_bytes`` more address space than this process has
    now (a bomb fails with MemoryError instead of taking the machine) and ``seconds`` of
    time (SIGALRM), both restored after."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (pages * resource.getpagesize() + extra_bytes, hard))

    def timeout(signum: int, frame: object) -> None:
        raise OverTime(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def check_outcome(args: list[str]) -> None:
    """Exit 0, 1 or 2 within the limits; no traceback; stderr only ``tracetool:`` lines, and
    on an error exactly one ``tracetool: error:`` line, the last."""
    with bounded(20):
        try:
            r = CliRunner().invoke(cli, args)
        except OverTime as err:
            raise AssertionError(f"{args[2:]}: {err}") from None
    shown = [a if len(a) < 80 else a[:60] + f"...({len(a)} chars)" for a in args[2:]]
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"{shown}: {r.exception!r}") from r.exception
    lines = r.stderr.splitlines()
    assert r.exit_code in (0, 1, 2), (shown, r.stderr)
    assert "Traceback" not in r.stderr, (shown, r.stderr)
    assert all(ln.startswith(("tracetool: warning: ", "tracetool: error: ")) for ln in lines), (
        shown, r.stderr)
    errors = [ln for ln in lines if ln.startswith("tracetool: error: ")]
    assert len(errors) == (r.exit_code != 0), (shown, r.stderr)
    assert not errors or lines[-1] == errors[0], (shown, r.stderr)


# the bounds' edges (MAX_RANK, MAX_WORLD, int64), overflowing, tiny and unparsable numbers
EDGES = ["0", "-1", "1e400", "-1e400", "nan", "inf", "-inf", "1e-300", str(2**63),
         str(2**64), str(10**12), str(MAX_RANK), str(MAX_WORLD + 1), "", "0x10", "\u0663",
         "9" * 5000]
RANGES = [f"0-{MAX_RANK}", "0-99999999999", f"0-{2**63}", f"0:{MAX_STEP}", f"0:{2**63}",
          "5:2", "-3:-1", "0-1,0-1"]
NET_UNITS = {"gpus_per_node": "", "ranks_per_dc": "", "inter_node_bw": "Gbit/s",
             "intra_node_bw": "GB/s", "dc_bw": "Mbit/s", "inter_node_latency": "us",
             "dc_latency": "ms"}
# the values an integer option (one type: tracetool/cli/_numbers.py) is tried with
INTS = ["0", "-1", "1e400", "nan", str(2**63), str(10**12), str(MAX_WORLD + 1), "", "9" * 5000]
SWEEP = ["sweep", "--out", "{out}/sweep-t"]
GLOO = ["--source-network", NET]
TABLE = {  # option -> (command and its other arguments, the values tried)
    "--ranks": (["replay", *GLOO], EDGES + RANGES),
    "--steps": (["replay", *GLOO], EDGES + RANGES),
    "--step": (["replay", *GLOO], INTS),
    "--dp-scale": (["replay", *GLOO], INTS + [str(MAX_WORLD)]),
    "--window": (["replay", *GLOO], [f"0ms:{v}ms" for v in EDGES] + [f"{v}s:1s" for v in EDGES]),
    "--instance": (["replay", *GLOO, "--annotation", "gloo:all_reduce"], INTS),
    "--network": (["replay", *GLOO], [f"{k}={v}{u}" for k, u in NET_UNITS.items()
                                      for v in EDGES[:8]]),
    "--gpu-clock": (["replay", *GLOO], EDGES[:9] + [f"{v}MHz" for v in EDGES[:9]]),
    "--power-cap": (["replay", *GLOO], [f"{v}{u}" for v in EDGES[:9] for u in ("W", "%")]),
    "--speedup": (["replay", *GLOO], [f"gemm={v}" for v in EDGES]),
    "--cpu-speedup": (["replay", *GLOO], EDGES),
    "sweep --network": ([*SWEEP, *GLOO], [f"{k}=1,{v}{u}" for k, u in NET_UNITS.items()
                                          for v in EDGES[:9] if u != "us"]),
    "sweep --dp-scale": ([*SWEEP, *GLOO], [f"1,{v}" for v in EDGES] + [str(MAX_WORLD)]),
    "sweep --cpu-speedup": ([*SWEEP, *GLOO], [f"1,{v}" for v in EDGES]),
    "critical-path --step": (["critical-path"], INTS),
    # (not 0: a whole report, the slowest thing here; the property test may draw it)
    "report --instance": (["report", "--out", "{out}/report-t", "--annotation",
                           "gloo:all_reduce"], INTS[1:]),
    "ingest --workers": (["ingest"], INTS),
}


@pytest.mark.parametrize("option", list(TABLE))
def test_every_numeric_option_at_its_edges(store: Path, option: str) -> None:
    """Each option with each edge value: at most 3 GiB more memory and 20 s each, exit 0, 1
    or 2, one line on an error, never a traceback."""
    command, values = TABLE[option]
    name = option.split()[-1]
    head = [a.format(out=store.parent) for a in command]
    for v in values:
        if head[0] == "ingest":  # into the module's store: stored already, so skipped
            check_outcome(["ingest", str(SAMPLES), "--store", str(store), f"{name}={v}"])
        else:
            check_outcome([head[0], str(store), *head[1:], f"{name}={v}"])


# the property test: random combinations of the options, each with a random value
EXTREME = st.sampled_from(EDGES + ["1", "2", "3", str(MAX_WORLD), "1.5", "1_000"])
NUMBER = st.one_of(EXTREME, EXTREME, st.integers(-2**70, 2**70).map(str),
                   st.floats().map(repr))
RANGE = st.one_of(st.sampled_from(RANGES), st.builds(
    lambda a, sep, b: f"{a}{sep}{b}", NUMBER, st.sampled_from(["-", ":", ","]), NUMBER))
UNIT = st.sampled_from(["", "Gbit/s", "GB/s", "b/s", "ms", "us", "s", "MHz", "W", "%"])
VALUE = st.builds(lambda n, u: n + u, st.one_of(NUMBER, RANGE), UNIT)
# a network key with a number in its own unit (else any unit)
NET_ITEM = st.sampled_from(sorted(NET_UNITS)).flatmap(lambda k: st.builds(
    lambda n, u: f"{k}={n}{u}", NUMBER, st.one_of(st.just(NET_UNITS[k]), UNIT)))
NETWORK = st.lists(NET_ITEM, min_size=1, max_size=3).map(",".join)
AXIS = st.sampled_from(sorted(NET_UNITS)).flatmap(lambda k: st.builds(
    lambda ns, u: f"{k}={','.join(ns)}{u}", st.lists(NUMBER, min_size=1, max_size=3),
    st.one_of(st.just(NET_UNITS[k]), UNIT)))


def _option(name: str, values: st.SearchStrategy) -> st.SearchStrategy:
    return values.map(lambda v: [f"{name}={v}"])


REPLAY_OPTIONS = [
    _option("--ranks", st.one_of(NUMBER, RANGE)), _option("--steps", st.one_of(NUMBER, RANGE)),
    _option("--step", NUMBER), _option("--dp-scale", NUMBER),
    _option("--instance", NUMBER).map(lambda a: ["--annotation", "gloo:all_reduce", *a]),
    _option("--window", st.builds(lambda a, b: f"{a}ms:{b}ms", NUMBER, NUMBER)),
    _option("--network", NETWORK), _option("--gpu-clock", VALUE),
    _option("--power-cap", VALUE), _option("--speedup", NUMBER.map(lambda f: f"gemm={f}")),
    _option("--cpu-speedup", NUMBER), _option("--expert-skew", NUMBER),
]
SWEEP_OPTIONS = [
    _option("--network", AXIS), _option("--dp-scale", st.lists(NUMBER, min_size=1, max_size=3)
                                        .map(",".join)),
    _option("--ranks", st.one_of(NUMBER, RANGE)), _option("--steps", st.one_of(NUMBER, RANGE)),
]
CP_OPTIONS = [_option("--step", NUMBER), REPLAY_OPTIONS[4], REPLAY_OPTIONS[5]]
INGEST_OPTIONS = [_option("--workers", NUMBER), _option("--tmp-budget", VALUE),
                  _option("--max-event-bytes", VALUE)]


def _picks(options: list[st.SearchStrategy]) -> st.SearchStrategy:
    """One to three of ``options``, each with a drawn value, as CLI arguments."""
    return st.lists(st.sampled_from(range(len(options))), min_size=1, max_size=3,
                    unique=True).flatmap(
        lambda idx: st.tuples(*(options[i] for i in idx)).map(
            lambda parts: [a for p in parts for a in p]))


FAST = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
FEWER = settings(FAST, max_examples=15)


@FAST
@given(extra=_picks(REPLAY_OPTIONS))
def test_replay_numbers_property(store: Path, extra: list[str]) -> None:
    check_outcome(["replay", str(store), "--source-network", NET, *extra])


@FEWER
@given(extra=_picks(SWEEP_OPTIONS))
def test_sweep_numbers_property(store: Path, extra: list[str]) -> None:
    if not any(a.startswith(("--network=", "--dp-scale=")) for a in extra):
        extra = [*extra, "--dp-scale=1,2"]
    check_outcome(["sweep", str(store), "--source-network", NET, "--out",
                   str(store.parent / "sweep-p"), *extra])


@FEWER
@given(extra=_picks(CP_OPTIONS), command=st.sampled_from(["critical-path", "report"]))
def test_critical_path_and_report_numbers_property(store: Path, extra: list[str],
                                                   command: str) -> None:
    if command == "report":
        extra = [a for a in extra if not a.startswith("--step=")] + [
            "--out", str(store.parent / "report-p")]
    check_outcome([command, str(store), *extra])


@FEWER
@given(extra=_picks(INGEST_OPTIONS))
def test_ingest_numbers_property(store: Path, extra: list[str]) -> None:
    """Into the module's store: the files are stored already, so a value that is accepted
    ends in 'skipped' without decoding."""
    check_outcome(["ingest", str(SAMPLES), "--store", str(store), *extra])
