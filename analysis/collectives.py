"""Warnings about how a job's collectives were matched across ranks.

The matching itself is SQL (``analysis/sql/40_collectives.sql``: ``collective_ranks``,
``collective_matching``; the method is in ``docs/collectives.md``). This module turns the
``collective_matching`` view into one-line warnings for people: ranks whose traces hold
different numbers of calls (their windows start or stop at different collectives), calls left
unmatched, alignments that are ambiguous or impossible. ``tracetool report`` puts them in the
report and prints them on stderr; other commands print them with :func:`warn_collectives`.

The same channel carries the one warning about the ranks' clocks (:func:`clock_warnings`):
when they disagree by more than a step, job_steps marks every step ``clocks_disagree``
(``analysis/sql/05_steps.sql``), and the warning says by how much, with the offsets that the
collectives' end times imply (``rank_clock_offsets``).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import duckdb

MAX_RANKS_LISTED = 8  # a warning names at most this many ranks, then says how many more


def collective_warnings(con: duckdb.DuckDBPyConnection, job: str) -> list[str]:
    """One line per problem with the matching of ``job``'s collectives, [] when none (and
    without matching anything for a job of one rank: a group needs two ranks to disagree)."""
    n_ranks = con.execute("SELECT count(DISTINCT rank) FROM trace_files WHERE job = ?",
                          [job]).fetchone()[0]
    if n_ranks < 2:
        return []
    cur = con.execute("""
        SELECT pg_name, rank, ref_rank, match, n_calls, n_unmatched, n_paired, shift, spread_ns,
               margin * greatest(spread_ns, 1000) AS runner_up_spread_ns, ambiguous
        FROM collective_matching WHERE job = ? ORDER BY pg_name NULLS FIRST, rank""", [job])
    cols = [d[0] for d in cur.description]
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for row in cur.fetchall():
        r = dict(zip(cols, row, strict=True))
        groups.setdefault(r["pg_name"], []).append(r)
    out: list[str] = []
    for pg, ranks in groups.items():
        out += _group_warnings(_group_label(pg), ranks)
    return out + clock_warnings(con, job)


def clock_warnings(con: duckdb.DuckDBPyConnection, job: str) -> list[str]:
    """One line when ``job``'s ranks started a step more than a step apart on their recorded
    clocks (job_steps.incomplete_reason 'clocks_disagree'), saying how far apart and, where
    collectives were matched confidently, each rank's clock offset; else []."""
    n, spread, step_ns = con.execute("""
        SELECT count(*), max(start_spread_ns), median(mean_rank_dur_ns) FROM job_steps
        WHERE job = ? AND incomplete_reason = 'clocks_disagree'""", [job]).fetchone()
    if not n:
        return []
    offsets = con.execute("""
        SELECT rank, offset_ns FROM rank_clock_offsets
        WHERE job = ? AND n_samples > 0 AND offset_ns <> 0 ORDER BY rank""", [job]).fetchall()
    ref = con.execute("SELECT min(rank) FROM rank_clock_offsets WHERE job = ? AND n_samples > 0",
                      [job]).fetchone()[0]
    by = ""
    if offsets:
        parts = [f"rank {r} {_span(abs(o))} {'ahead' if o > 0 else 'behind'}"
                 for r, o in offsets[:MAX_RANKS_LISTED]]
        more = len(offsets) - MAX_RANKS_LISTED
        by = (f"; by the collectives' end times (rank_clock_offsets), against rank {ref}: "
              + ", ".join(parts) + (f" and {more} more" if more > 0 else ""))
    return [f"the ranks' clocks disagree by more than a step: they started the same step up "
            f"to {_span(spread)} apart (a step is {_span(step_ns)}){by}; the "
            f"{_n(n, 'job step')} {'is' if n == 1 else 'are'} left out as incomplete "
            "(clocks_disagree, docs/steps.md); each rank's own steps stand"]


def missing_ranks_note(job: str, ranks: list[int], world_size: int | None) -> str | None:
    """The sentence every command prints once for a job that holds fewer ranks than its traces
    name (``job_world``: distributedInfo.world_size, pg_config), None for a whole job."""
    if world_size is None or world_size <= len(ranks):
        return None
    held = (f"rank {ranks[0]}" if len(ranks) == 1
            else f"{len(ranks)} ranks ({_ranks_text(sorted(ranks))})")
    return (f"job {job} holds {held} of {world_size} (distributedInfo / pg_config): the "
            f"other {world_size - len(ranks)} are not in the store, so the collectives' waits "
            "and skew and the critical path see only the traced "
            f"rank{'' if len(ranks) == 1 else 's'}")


def job_missing_ranks_note(con: duckdb.DuckDBPyConnection, job: str) -> str | None:
    """``missing_ranks_note`` of ``job`` in the store ``con`` reads (view job_world)."""
    row = con.execute("""SELECT w.world_size, (SELECT list(DISTINCT rank ORDER BY rank)
                                                FROM trace_files WHERE job = w.job)
                         FROM job_world w WHERE w.job = ?""", [job]).fetchone()
    return None if row is None else missing_ranks_note(job, row[1] or [], row[0])


def warn_collectives(con: duckdb.DuckDBPyConnection, job: str,
                     file: TextIO | None = None) -> list[str]:
    """Print ``job``'s collective warnings, each as ``tracetool: warning: ...`` on stderr
    (or ``file``), and return them."""
    warnings = collective_warnings(con, job)
    for w in warnings:
        print(f"tracetool: warning: {w}", file=file or sys.stderr)
    return warnings


def _group_label(pg: str | None) -> str:
    return "collectives (no process group recorded)" if pg is None \
        else f"collectives of process group {pg}"


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:MAX_RANKS_LISTED]))
    more = len(ranks) - MAX_RANKS_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _group_warnings(label: str, ranks: list[dict[str, Any]]) -> list[str]:
    if len(ranks) < 2 or ranks[0]["match"] == "seq" and not any(
            r["n_unmatched"] for r in ranks):
        return []
    out = []
    # paired send/recv calls are matched per ordered pair, not with the group's others:
    # ranks of a pipeline make different numbers of them
    counts = {r["rank"]: r["n_calls"] - r["n_paired"] for r in ranks}
    unmatched = sum(r["n_unmatched"] for r in ranks)
    if len(set(counts.values())) > 1:
        per_rank = _counts_text(counts)
        out.append(f"{label}: ranks have different call counts ({per_rank}): their trace "
                   f"windows start or stop at different collectives; {_n(unmatched, 'call')} "
                   f"found on only some ranks left unmatched")
    elif unmatched:
        out.append(f"{label}: {_n(unmatched, 'call')} could not be matched across ranks (missing "
                   f"on some rank, or kind, dtype, size or stream differ)")
    ambiguous = [r for r in ranks if r["ambiguous"]]
    if ambiguous:
        r = ambiguous[0]
        out.append(
            f"{label}: the alignment of rank{'s' if len(ambiguous) > 1 else ''} "
            f"{_ranks_text([a['rank'] for a in ambiguous])} to rank {r['ref_rank']} is "
            f"ambiguous (rank {r['rank']}: shift {r['shift']} spreads end times by "
            f"{_us(r['spread_ns'])}, the next best shift by {_us(r['runner_up_spread_ns'])}); "
            f"those instances do not set clock offsets")
    if ranks[0]["match"] != "seq":
        # one call on a rank and on the reference rank, matched: there is one pairing and
        # nothing to align (the alignment needs two pairs), so call order is no guess
        ref_calls = counts.get(ranks[0]["ref_rank"])
        unaligned = [r["rank"] for r in ranks
                     if r["match"] == "call_order" and r["rank"] != r["ref_rank"]
                     and not (r["n_calls"] == ref_calls == 1 and not r["n_unmatched"])]
        if unaligned:
            out.append(f"{label}: the calls of rank{'s' if len(unaligned) > 1 else ''} "
                       f"{_ranks_text(unaligned)} could not be aligned to rank "
                       f"{ranks[0]['ref_rank']}'s by kind and end time; they are matched by "
                       f"call order, where kinds agree, and do not set clock offsets")
    return out


def _counts_text(counts: dict[int, int]) -> str:
    """'rank 0: 32, rank 1: 29'; for many ranks the odd ones and the usual count."""
    if len(counts) <= MAX_RANKS_LISTED:
        return ", ".join(f"rank {k}: {v}" for k, v in counts.items())
    values = list(counts.values())
    usual = max(set(values), key=values.count)
    odd = {k: v for k, v in counts.items() if v != usual}
    if len(odd) > MAX_RANKS_LISTED:
        return f"{min(values)} to {max(values)} per rank"
    return ", ".join(f"rank {k}: {v}" for k, v in odd.items()) + f", the others: {usual}"


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _us(ns: int | None) -> str:
    return "?" if ns is None else f"{ns / 1e3:,.0f} us"


def _span(ns: float) -> str:
    """A duration from microseconds to days, in the unit that reads best."""
    for unit, size in (("days", 86_400e9), ("h", 3_600e9), ("s", 1e9), ("ms", 1e6)):
        if ns >= size:
            return f"{ns / size:,.1f} {unit}"
    return f"{ns / 1e3:,.0f} us"
