"""``tracetool report``'s "Collectives by link" (issue 28): replay's collective listing in
the report, as measured on the job's placement and projected under --network / --placement,
on the rig's 4-rank gloo job (sample_traces/netlab/w4_1gbit: one 101 MB allreduce group over
ranks 0-3, 24 calls in its 6 complete steps, two of them in flight at once on gloo's two
threads). The report and ``replay --json`` must agree row for row, and the measured exposed
time must add up to step_breakdown's exposed comm (the one definition, analysis/sql)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import tracetool
from tests._util import REPO, kineto_text, run, write, x
from tests.conftest import run_ingest
from tracetool.analysis.report import links_section, text_table
from tracetool.cli.report import collective_links
from tracetool.replay.placement import read_placement

W4 = REPO / "sample_traces" / "netlab" / "w4_1gbit"
SRC = "gpus_per_node=1,inter_node_bw=1Gbit/s,inter_node_latency=43us"
DC = "ranks_per_dc=2,dc_latency=4.9ms"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("links") / "store"
    assert run_ingest([W4], path, "--job", "w4").exit_code == 0
    yield path


def _report(store: Path, out: Path, *args: str | Path) -> dict:
    code, stdout, err = run("report", store, "--out", out, "--json", *args)
    assert code == 0, err
    return json.loads(stdout)


def _replay(store: Path, *args: str | Path) -> dict:
    code, stdout, err = run("replay", store, "--json", *args)
    assert code == 0, err
    return json.loads(stdout)


def test_as_measured_the_rows_are_replays_and_add_up_to_the_views(store: Path,
                                                                   tmp_path: Path) -> None:
    links = _report(store, tmp_path / "r", "--source-network", SRC)["collective_links"]
    assert {k: v for k, v in links.items() if k != "rows"} == {
        "available": True, "reason": None, "where": "placement gpus_per_node=1",
        "projected": False, "network": None}
    # replay's identity listing on the same source network, row for row
    assert links["rows"] == _replay(store, "--source-network", SRC)["collectives"]
    (row,) = links["rows"]
    # independently, from the views: the complete steps' instances, their sizes and
    # transfers (collective_instances), and the mean over ranks of each step's exposed comm
    # (step_breakdown), summed over the steps
    c = tracetool.connect(store)
    n, size, transfer = c.execute("""
        SELECT count(*), sum(b)::BIGINT, sum(t)::BIGINT FROM (
            SELECT instance, max(bytes) AS b, max(transfer_ns) AS t FROM collective_instances
            WHERE job = 'w4' AND step IN (SELECT step FROM job_steps
                                          WHERE job = 'w4' AND complete)
            GROUP BY instance)""").fetchone()
    (exposed,) = c.execute("""
        SELECT sum(e) FROM (SELECT step, avg(exposed_comm_ns) AS e FROM step_breakdown
                            WHERE job = 'w4' AND complete GROUP BY step)""").fetchone()
    c.close()
    assert (n, size, transfer) == (24, 101_007_624, 2_237_744_631)
    assert (row["kind"], row["group"], row["links"], row["instances"], row["bytes"],
            row["measured_transfer_ns"]) == ("allreduce", [0, 1, 2, 3], ["inter"], n, size,
                                             transfer)
    assert exposed == pytest.approx(1_077_793_998.25, abs=0.01)
    assert row["measured_exposed_ns"] == 1_077_793_998  # the shares, rounded once per row
    assert row["projected_exposed_ns"] == row["measured_exposed_ns"]
    # the page: as measured, no projected columns
    md = (tmp_path / "r" / "report.md").read_text()
    section = md[md.index("## Collectives by link"):md.index("## Critical path")]
    assert r"(as measured, placement gpus\_per\_node=1)" in section  # Markdown-escaped
    assert "| kind | group | links | n | MB | transfer ms | exposed ms |" in section
    assert "| allreduce | 0-3 | inter | 24 | 101.008 | 2,237.745 | 1,077.794 |" in section
    html = (tmp_path / "r" / "report.html").read_text()
    assert ("<tr><td>allreduce</td><td>0-3</td><td>inter</td><td>24</td><td>101.008</td>"
            "<td>2,237.745</td><td>1,077.794</td></tr>") in html


def test_a_cpu_job_without_source_network_says_the_links_are_unknown(store: Path) -> None:
    # the section's data and text straight from the CLI layer's function (no charts drawn)
    with tracetool.connect(store) as c:
        links = collective_links(c, store, "w4", None, None, None, False)
    assert links["where"] == "network unknown: give --source-network"
    (row,) = links["rows"]
    assert row["links"] is None and row["instances"] == 24
    sec = links_section(links)
    assert sec.lines[0].startswith("Per kind and group, summed over the steps (as measured, "
                                   "network unknown: give --source-network):")
    assert [c.split() for c in text_table(*sec.tables[0])[2:]] == [
        ["allreduce", "0-3", "?", "24", "101.008", "2,237.745", "1,077.794"]]


INTER = "rank,node,datacenter\n0,a,e\n1,b,w\n2,c,e\n3,d,w\n"  # interleaved, a node each


@pytest.mark.parametrize(("args", "links"), [
    (["--network", DC], ["inter", "dc"]),  # 2 + 2 across 4.9 ms: 2 of the ring's 4 links
    (["--network", "dc_latency=4.9ms", "--placement", "inter.csv"], ["inter", "dc"]),
])
def test_a_what_if_projects_as_replay_does(store: Path, tmp_path: Path, args: list[str],
                                           links: list[str]) -> None:
    (tmp_path / "inter.csv").write_text(INTER)
    args = [str(tmp_path / a) if a.endswith(".csv") else a for a in args]
    want = _replay(store, "--source-network", SRC, *args)["collectives"]
    (row,) = want
    assert row["links"] == links
    assert row["projected_transfer_ns"] > 1.05 * row["measured_transfer_ns"]
    if "--placement" in args:  # the CLI layer's function alone (no report drawn)
        with tracetool.connect(store) as c:
            links_out = collective_links(c, store, "w4", SRC, args[1],
                                         read_placement(args[3]), False)
        assert links_out["rows"] == want and links_out["projected"] is True
        return
    links_out = _report(store, tmp_path / "r", "--source-network", SRC, *args)[
        "collective_links"]
    assert links_out["rows"] == want and links_out["projected"] is True
    md = (tmp_path / "r" / "report.md").read_text()
    assert (f"(projected onto network {DC}, placement gpus_per_node=1,ranks_per_dc=2)"
            .replace("_", r"\_") in md)
    assert ("| kind | group | links | n | MB | transfer ms | projected ms | exposed ms | "
            "projected exposed ms |") in md
    assert (f"| allreduce | 0-3 | {'+'.join(links)} | 24 | 101.008 | 2,237.745 | "
            f"{row['projected_transfer_ns'] / 1e6:,.3f} | 1,077.794 | "
            f"{row['projected_exposed_ns'] / 1e6:,.3f} |") in md


def test_a_placement_that_changes_nothing_is_refused_as_replay_refuses_it(
        store: Path, tmp_path: Path) -> None:
    # a node per rank in two datacenters with no datacenter link set: every collective
    # crosses the links it crossed
    placement = tmp_path / "inter.csv"
    placement.write_text(INTER)
    out = tmp_path / "r"
    want = (f"tracetool: error: network setting(s) --placement {placement} change nothing "
            "for job w4: every collective crosses the same links")
    for args in (["replay", store, "--json"], ["report", store, "--out", out]):
        code, _, err = run(*args, "--source-network", SRC, "--placement", placement)
        assert code == 2 and err.startswith(want) and err.count("\n") == 1, (args[0], err)
    assert not (out / "report.md").exists()  # refused before anything was drawn


def test_bad_what_ifs_are_one_line_before_anything_is_drawn(store: Path, tmp_path: Path
                                                            ) -> None:
    short = tmp_path / "short.csv"
    short.write_text("rank,node\n0,a\n1,b\n")
    out = tmp_path / "r"
    for args, code, message in [
        (["--placement", short], 2, f"placement {short}: places ranks 0-1, but job w4 has 4 "
                                    "ranks (0-3): place each exactly once"),
        (["--placement", short, "--network", "gpus_per_node=2"], 2,
         f"--placement {short} places the ranks: give it or gpus_per_node in --network, not "
         "both"),
        (["--network", "dc_bw=fast"], 2, None),
        (["--network", SRC], 2, None),  # the source network again: changes nothing
    ]:
        rc, stdout, err = run("report", store, "--out", out, "--source-network", SRC, *args)
        assert rc == code and err.count("\n") == 1 and "Traceback" not in err, (args, err)
        if message is not None:
            assert err == f"tracetool: error: {message}\n", args
        assert not (out / "report.md").exists(), args


def test_the_measured_listing_is_the_identity_runs_without_simulating(store: Path) -> None:
    """The report's listing as measured (``collective_listing(..., None)``: no schedule) is
    an identity replay's, on the steps a run reports: here steps 3-4 of a bounded graph that
    also holds step 2's collectives (the events just before, kept as fixed points)."""
    from tracetool.replay.graph import Bounds
    from tracetool.replay.run import Replayer, collective_listing

    with tracetool.connect(store) as c:
        rp = Replayer.from_store(c, "w4", Bounds((3, 4), None))
        assert sorted(set(rp.graph.insts["step"].tolist())) == [2, 3, 4]
        measured = collective_listing(rp, None, None)
        assert measured == collective_listing(rp, None, rp.run(None, critical_path=False))
    (row,) = measured
    assert row["instances"] == 8  # 4 a step , 2 steps


def test_a_job_without_collectives_has_no_section_and_refuses_a_source_network(
        tmp_path: Path) -> None:
    trace = write(tmp_path / "rank0.json", kineto_text([
        x("ProfilerStep#1", 0, 100, cat="user_annotation"), x("aten::mm", 10, 50)]))
    store = tmp_path / "store"
    assert run_ingest([trace], store, "--job", "solo").exit_code == 0
    with tracetool.connect(store) as c:
        assert collective_links(c, store, "solo", None, None, None, False) is None
    code, _, err = run("report", store, "--out", tmp_path / "r", "--source-network", SRC)
    assert (code, err) == (2, "tracetool: error: --source-network: job solo has no collective "
                              "whose links it would place: it changes nothing\n")
