-- Collectives matched across ranks (docs/collectives.md has the method and a worked example).
-- Needs: collectives, trace_files, events (store tables).
--
-- One call of a process group is one instance on every rank of the group. With a sequence
-- number (args Seq, traces since late 2023) the instance is (group, seq). Without one, each
-- rank's call sequence in the group is aligned to the group's reference rank (its lowest):
-- the shift of call indices is chosen under which the calls' signatures (kind, dtype, size,
-- stream) agree and their end times are most consistent (a collective ends at the same time
-- on every rank once clocks are aligned, so at the right shift end_r - end_ref is a
-- constant, the clock offset, plus jitter). Calls that exist on only some ranks (cut off by
-- a trace window that starts or stops at a different call) stay unmatched (instance NULL).

-- The kind of a collective, from the name PyTorch records (all_reduce, allreduce,
-- _allgather_base, all_gather_into_tensor, reduce_scatter_tensor, alltoall_base, ...): one of
-- allreduce, allgather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter,
-- send, recv, barrier, other. The one normalisation of collective names: the views below and
-- the replay's network model (tracetool.replay.network.KINDS) use these names.
CREATE OR REPLACE MACRO collective_kind(name) AS (
    WITH n AS (SELECT replace(lower(coalesce(name, '')), '_', '') AS x)
    SELECT CASE WHEN x LIKE '%allreduce%' THEN 'allreduce'
                WHEN x LIKE '%allgather%' THEN 'allgather'
                WHEN x LIKE '%reducescatter%' THEN 'reduce_scatter'
                WHEN x LIKE '%alltoall%' THEN 'all_to_all'
                WHEN x LIKE '%broadcast%' THEN 'broadcast'
                WHEN x LIKE '%barrier%' THEN 'barrier'
                WHEN x LIKE '%gather%' THEN 'gather'
                WHEN x LIKE '%scatter%' THEN 'scatter'
                WHEN x LIKE '%reduce%' THEN 'reduce'
                WHEN x LIKE '%send%' THEN 'send'
                WHEN x LIKE '%recv%' THEN 'recv'
                ELSE 'other' END FROM n);

-- @view process_groups: the process groups each job's traces describe
--   (distributedInfo.pg_config), one row per job and group.
-- job, pg_name, pg_desc: the group (pg_config's pg_name, pg_desc). pg_size: its ranks
--   (pg_size, else the number of ranks listed). ranks: the global ranks it lists (Kineto's
--   on-demand fallback writes them as a string: parsed), NULL when none are listed.
--   Ranks that disagree about a group (they should not) give the largest.
CREATE OR REPLACE VIEW process_groups WITH (DEFER_BINDING) AS
WITH g AS (
    SELECT job, unnest(CAST(json_extract(distributed_info, '$.pg_config') AS JSON[])) AS g
    FROM trace_files
    WHERE json_type(json_extract(distributed_info, '$.pg_config')) = 'ARRAY'),
p AS (
    SELECT job, g->>'pg_name' AS pg_name, g->>'pg_desc' AS pg_desc,
           TRY_CAST(g->>'pg_size' AS INTEGER) AS size,
           list_transform(regexp_extract_all(coalesce(g->>'ranks', ''), '-?\d+'),
                          lambda x: x::INTEGER) AS ranks
    FROM g)
SELECT job, pg_name, any_value(pg_desc) AS pg_desc,
       max(coalesce(size, nullif(len(ranks), 0)))::INTEGER AS pg_size,
       arg_max(nullif(ranks, []), len(ranks)) AS ranks
FROM p WHERE pg_name IS NOT NULL GROUP BY job, pg_name;

-- @view job_world: how many ranks each job has, as its traces say, against how many the
--   store holds: a job traced on one rank of many (tracetool report, critical-path and
--   replay say so).
-- job. n_ranks: ranks the store holds. world_size: the job's size as its traces name it,
--   the largest of the ranks' distributedInfo.world_size, their process groups' pg_size and
--   the highest rank those groups list + 1; NULL when the traces name none.
-- n_missing: world_size - n_ranks, the ranks not traced (0 when the store holds them all or
--   world_size is NULL).
CREATE OR REPLACE VIEW job_world WITH (DEFER_BINDING) AS
WITH f AS (SELECT job, count(DISTINCT rank) AS n_ranks, max(world_size) AS ws
           FROM trace_files GROUP BY job),
g AS (SELECT job, max(pg_size) AS pg_size, max(list_max(ranks)) + 1 AS pg_ranks
      FROM process_groups GROUP BY job)
SELECT f.job, f.n_ranks,
       nullif(greatest(coalesce(f.ws, 0), coalesce(g.pg_size, 0), coalesce(g.pg_ranks, 0)),
              0)::INTEGER AS world_size,
       greatest(0, coalesce(greatest(coalesce(f.ws, 0), coalesce(g.pg_size, 0),
                                     coalesce(g.pg_ranks, 0)) - f.n_ranks, 0))::INTEGER
           AS n_missing
FROM f LEFT JOIN g USING (job);

-- Two ranks' calls can be the same call: kind, dtype, bytes, stream and step (fields of a
-- call's signature, see collective_ranks) equal wherever both are known.
CREATE OR REPLACE MACRO _collective_same_call(a, b) AS
    coalesce(a.kind = b.kind, TRUE) AND coalesce(a.dtype = b.dtype, TRUE)
    AND coalesce(a.bytes = b.bytes, TRUE) AND coalesce(a.stream = b.stream, TRUE)
    AND coalesce(a.step = b.step, TRUE);

-- @view collective_ranks: collectives with the key that matches one call across ranks.
-- All columns of collectives (group_size completed: the call's Group size or listed ranks,
--   else its process group's pg_size from pg_config, else, for a call that names no group,
--   the job's world_size: PyTorch's default group spans the world), plus:
-- group_size_from: where group_size came from: 'call' (the call's args or ranks),
--   'pg_config', 'world_size' (job_world), NULL when unknown. A job that holds one rank of
--   many (job_world.n_missing > 0) still has its collectives' true group sizes here, and the
--   replay prices each over its group's size, the untraced ranks assumed to run as the
--   traced ones do.
-- kind: collective_kind(collective), the collective's normalised name.
-- bytes: the message size nccl-tests calls S: allgather the gathered output (out_bytes, else
--   in_bytes x group_size), the others the input (in_bytes, else out_bytes). The one
--   definition: collective_instances and the replay's network model use it.
-- instance: 'pg:<pg_name>:seq:<seq>' when every call of the group recorded its sequence
--   number, else 'pg:<pg_name>:call:<n>', n the call's index on the group's reference
--   rank (its lowest) after alignment (call_index - match_shift). NULL for a call that is
--   unmatched: not present on every rank of the job that calls the group (a trace window
--   that starts or ends at another call), or, without seq, whose signature differs from
--   the reference rank's call. A send/recv whose peer (peer_rank, a rank of the call's
--   group: global through group_ranks) is a traced rank of the job is a point-to-point
--   pair instead: 'p2p:<pg_name>:<src>><dst>:step:<step>:<k>', the k-th send from src to
--   dst of a ProfilerStep with the k-th receive of that step (NULL for a step whose two ends
--   made different numbers of them), or 'p2p:<pg_name>:<src>><dst>:<k>' without steps (the
--   k-th of the trace, when both ends made as many). Everything that pairs calls across ranks
--   (rank_clock_offsets, collective_instances, stragglers, the critical path, replay) keys
--   on this column.
-- match: how the instance was matched: 'pair' (a send and its receive, above; the group's
--   other calls are aligned or numbered without the paired ones), 'seq' (sequence numbers), 'aligned' (every rank's
--   call sequence aligned to the reference rank's), 'call_order' (the n-th call on every
--   rank, unshifted: the group has one rank, or some rank's sequence could not be
--   aligned). Unmatched calls have it too: how their group is matched.
-- match_shift: this rank's shift (0 for seq, call_order and the reference rank).
-- match_spread_ns, match_margin: how well this rank's alignment fits (NULL for seq,
--   call_order and the reference rank): the spread of its end-time differences to the
--   reference under the chosen shift, and the next best shift's spread / max(spread, 1 us)
--   (NULL: no other shift is plausible).
-- match_confident: TRUE for seq, and for aligned instances where every rank's margin is at
--   least 3 (not ambiguous); only these set clock offsets (rank_clock_offsets).
--
-- The alignment. A call's signature is (kind, dtype, bytes, stream, step): kind as above (send and
-- recv are one kind, 'p2p'; an unknown name is itself, lowercased),
-- dtype lowercased, bytes = in_bytes except for all_to_all and p2p (their sizes differ by
-- rank), stream the kernel stream's ordinal among the rank's streams of the group (stream
-- ids are per process), step the call's ProfilerStep (one iteration on every rank); unknown
-- fields match anything (_collective_same_call). For each
-- rank of a group without seq, each shift |s| <= max(8, |difference of the call counts| +
-- 3), at most 64, is scored on the pairs (reference call i < 128, this rank's call i + s):
-- d = end_ns - reference end_ns for the pairs whose signatures agree; spread = the median
-- absolute deviation of d over all pairs, a disagreeing pair counting as infinitely far (so
-- a shift under which many signatures disagree cannot win). A shift is plausible with at
-- least 2 pairs, at least half as many as the shorter sequence (at most 128) and a
-- majority of agreeing pairs. The constant part of d (its median) is the clock offset that
-- the shift implies, so clocks need not be aligned first. Among the plausible shifts whose
-- spread is within 3x the smallest (the end times cannot tell them apart: calls that repeat
-- every step or every bucket fit a shift of whole periods almost as well), the one implying
-- the smallest clock offset wins (then the smaller spread, the most agreeing pairs, the
-- smallest |s|): clocks of one host agree, and NTP keeps hosts within milliseconds, while a
-- wrong shift of whole periods implies an offset of whole periods. Its margin is the next
-- best shift's spread / max(spread, 1 us), counting only rivals whose offset is within
-- SKEW (10 ms) of the chosen one's: a rival that needs clocks 300 ms apart is no rival.
-- A rank with no plausible shift is matched by call order.
CREATE OR REPLACE VIEW collective_ranks WITH (DEFER_BINDING) AS
WITH src AS MATERIALIZED (  -- the table, read once (one Parquet file per rank: at 1,024
                            -- ranks each scan of it costs more than the matching)
    SELECT c.* REPLACE (coalesce(c.group_size, pg.pg_size, CASE WHEN c.pg_name IS NULL
                                                              THEN w.world_size END)
                            AS group_size),
           CASE WHEN c.group_size IS NOT NULL THEN 'call'
                WHEN pg.pg_size IS NOT NULL THEN 'pg_config'
                WHEN c.pg_name IS NULL AND w.world_size IS NOT NULL THEN 'world_size'
           END AS group_size_from
    FROM collectives c
    LEFT JOIN process_groups pg ON pg.job = c.job AND pg.pg_name = c.pg_name
    LEFT JOIN job_world w ON w.job = c.job),
peers AS MATERIALIZED (  -- send/recv calls whose peer is a traced rank of the job: paired
    SELECT s.job, s.rank, coalesce(s.pg_name, '?') AS pg_key, s.call_index,
           collective_kind(s.collective) AS p2p_kind, s.step,
           -- the recorded peer is the group's rank: the global one through the group's list
           CASE WHEN len(s.group_ranks) > s.peer_rank AND s.peer_rank >= 0
                     AND NOT coalesce(s.group_ranks_truncated, FALSE)
                THEN s.group_ranks[s.peer_rank + 1] ELSE s.peer_rank END AS peer
    FROM src s
    WHERE s.peer_rank IS NOT NULL AND collective_kind(s.collective) IN ('send', 'recv')),
pp AS MATERIALIZED (
    SELECT p.*, CASE p2p_kind WHEN 'send' THEN p.rank ELSE p.peer END AS src_rank,
           CASE p2p_kind WHEN 'send' THEN p.peer ELSE p.rank END AS dst_rank,
           row_number() OVER (PARTITION BY p.job, p.pg_key, p.rank, p2p_kind, p.peer
                              ORDER BY p.call_index) - 1 AS k,
           count(*) OVER (PARTITION BY p.job, p.pg_key, p.rank, p2p_kind, p.peer) AS n,
           row_number() OVER (PARTITION BY p.job, p.pg_key, p.rank, p2p_kind, p.peer, p.step
                              ORDER BY p.call_index) - 1 AS ks,
           count(*) OVER (PARTITION BY p.job, p.pg_key, p.rank, p2p_kind, p.peer, p.step)
               AS ns
    FROM peers p
    WHERE p.peer <> p.rank
      AND EXISTS (SELECT 1 FROM trace_files t WHERE t.job = p.job AND t.rank = p.peer)),
pair_rule AS (  -- per ordered pair (and group): by step when every call of both ends has
                -- one, else the k-th with the k-th when both ends made as many calls
    SELECT job, pg_key, src_rank, dst_rank, bool_and(step IS NOT NULL) AS by_step,
           count(DISTINCT p2p_kind) = 2 AND count(DISTINCT n) = 1 AS same_count
    FROM pp GROUP BY ALL),
pair_steps AS (  -- steps in which both ends made as many calls
    SELECT job, pg_key, src_rank, dst_rank, step FROM pp WHERE step IS NOT NULL
    GROUP BY ALL HAVING count(DISTINCT p2p_kind) = 2 AND count(DISTINCT ns) = 1),
paired AS MATERIALIZED (
    SELECT p.job, p.rank, p.pg_key, p.call_index,
           row_number() OVER (PARTITION BY p.job, p.rank, p.pg_key ORDER BY p.call_index)
               AS n_before,  -- paired calls of the rank and group up to this one
           CASE WHEN r.by_step AND s.step IS NOT NULL
                THEN 'p2p:' || p.pg_key || ':' || p.src_rank || '>' || p.dst_rank
                     || ':step:' || p.step || ':' || p.ks
                WHEN NOT r.by_step AND r.same_count
                THEN 'p2p:' || p.pg_key || ':' || p.src_rank || '>' || p.dst_rank || ':' || p.k
           END AS instance
    FROM pp p JOIN pair_rule r USING (job, pg_key, src_rank, dst_rank)
    LEFT JOIN pair_steps s USING (job, pg_key, src_rank, dst_rank, step)),
c0 AS MATERIALIZED (  -- every call but the paired ones, narrowed to what matching needs;
                      -- call_index renumbered without them (the same where there are none)
    SELECT s.job, s.rank, coalesce(s.pg_name, '?') AS pg_key,
           s.call_index - coalesce(x.n_before, 0) AS call_index,
           s.call_index AS raw_index, s.seq, s.end_ns, s.step,
           s.kernel_stream, lower(s.dtype) AS dtype, s.in_bytes,
           CASE collective_kind(s.collective) WHEN 'send' THEN 'p2p' WHEN 'recv' THEN 'p2p'
                WHEN 'other' THEN lower(s.collective) ELSE collective_kind(s.collective) END
               AS kind
    FROM src s
    ASOF LEFT JOIN paired x ON x.job = s.job AND x.rank = s.rank
                           AND x.pg_key = coalesce(s.pg_name, '?')
                           AND x.call_index <= s.call_index
    WHERE x.call_index IS DISTINCT FROM s.call_index),  -- not itself paired
streams AS (
    SELECT job, rank, pg_key, kernel_stream,
           row_number() OVER (PARTITION BY job, rank, pg_key ORDER BY kernel_stream) AS ord
    FROM (SELECT DISTINCT job, rank, pg_key, kernel_stream FROM c0
          WHERE kernel_stream IS NOT NULL)),
calls AS MATERIALIZED (
    SELECT c.job, c.rank, c.pg_key, c.call_index, c.seq, c.end_ns,
           struct_pack(kind := c.kind, dtype := c.dtype,
                       bytes := CASE WHEN c.kind IN ('all_to_all', 'p2p')
                                     THEN NULL ELSE c.in_bytes END,
                       stream := s.ord, step := c.step) AS sig
    FROM c0 c LEFT JOIN streams s USING (job, rank, pg_key, kernel_stream)),
g AS MATERIALIZED (  -- each rank of each group
    SELECT job, pg_key, rank, n_calls, min(rank) OVER w AS ref_rank,
           count(*) OVER w AS n_ranks, sum(n_seq) OVER w = sum(n_calls) OVER w AS by_seq
    FROM (SELECT job, pg_key, rank, count(*) AS n_calls, count(seq) AS n_seq FROM c0
          GROUP BY ALL)
    WINDOW w AS (PARTITION BY job, pg_key)),
cand AS (  -- candidate shifts of each non-reference rank of a group without seq
    SELECT n.job, n.pg_key, n.rank, n.ref_rank, least(n.n_calls, r.n_calls, 128) AS n_max,
           unnest(range(-w.k, w.k + 1)) AS shift
    FROM g n JOIN g r ON r.job = n.job AND r.pg_key = n.pg_key AND r.rank = n.ref_rank
    CROSS JOIN LATERAL (SELECT least(64, greatest(8, abs(n.n_calls - r.n_calls) + 3)) AS k) w
    WHERE NOT n.by_seq AND n.rank <> n.ref_rank),
pairs AS (
    SELECT c.job, c.pg_key, c.rank, c.shift, c.n_max, x.end_ns - f.end_ns AS d,
           coalesce(_collective_same_call(f.sig, x.sig) AND d IS NOT NULL, FALSE) AS agree
    FROM cand c
    JOIN calls f ON f.job = c.job AND f.pg_key = c.pg_key AND f.rank = c.ref_rank
                AND f.call_index < 128
    JOIN calls x ON x.job = c.job AND x.pg_key = c.pg_key AND x.rank = c.rank
                AND x.call_index = f.call_index + c.shift AND x.call_index < 128 + 64),
score AS (
    SELECT job, pg_key, rank, shift, count(*) FILTER (agree) AS n_agree,
           -- a disagreeing pair is an outlier: 4e18 ns away from every real difference
           mad(CASE WHEN agree THEN d ELSE 4000000000000000000 END)::BIGINT AS mad_ns,
           median(d) FILTER (agree)::BIGINT AS offset_ns
    FROM pairs GROUP BY ALL
    HAVING count(*) >= greatest(2, any_value(n_max) // 2)
       AND 2 * count(*) FILTER (agree) > count(*)),
spread AS (
    SELECT *, CASE WHEN mad_ns < 1000000000000000000 THEN mad_ns END AS spread_ns
    FROM score),
near AS (  -- close: the end times cannot tell this shift from the best one
    SELECT *, coalesce(spread_ns <= 3 * greatest(min(spread_ns) OVER (
                  PARTITION BY job, pg_key, rank), 1000), FALSE) AS close
    FROM spread),
ranked AS (
    SELECT *,
           row_number() OVER (PARTITION BY job, pg_key, rank
                              ORDER BY close DESC, CASE WHEN close THEN abs(offset_ns) END,
                                       spread_ns NULLS LAST, n_agree DESC, abs(shift),
                                       shift) AS pos
    FROM near),
shifts AS (  -- the chosen shift of each rank that has a plausible one
    SELECT b.job, b.pg_key, b.rank, b.shift, b.spread_ns,
           min(u.spread_ns) / greatest(b.spread_ns, 1000) AS margin
    FROM ranked b
    LEFT JOIN ranked u ON u.job = b.job AND u.pg_key = b.pg_key AND u.rank = b.rank
                      AND u.pos > 1 AND u.spread_ns IS NOT NULL
                      AND abs(u.offset_ns - b.offset_ns) <= 10000000  -- SKEW: 10 ms
    WHERE b.pos = 1 AND b.spread_ns IS NOT NULL
    GROUP BY b.job, b.pg_key, b.rank, b.shift, b.spread_ns),
r AS (  -- each rank of each group: its shift, and what makes its calls uncertain
    SELECT g.*, CASE WHEN g.by_seq THEN 0 ELSE coalesce(s.shift, 0) END AS match_shift,
           s.spread_ns, s.margin,
           NOT g.by_seq AND g.rank <> g.ref_rank AND s.shift IS NULL AS unaligned,
           coalesce(s.margin < 3, FALSE) AS ambiguous
    FROM g LEFT JOIN shifts s USING (job, pg_key, rank)),
grp AS (  -- each group: how it is matched, and (no seq) the positions on all of its ranks
    SELECT job, pg_key, any_value(by_seq) AS by_seq,
           max(-match_shift) AS lo, min(n_calls - 1 - match_shift) AS hi,
           CASE WHEN any_value(by_seq) THEN 'seq'
                WHEN any_value(n_ranks) = 1 OR bool_or(unaligned) THEN 'call_order'
                ELSE 'aligned' END AS match,
           any_value(by_seq) OR (any_value(n_ranks) > 1
                                 AND NOT bool_or(unaligned OR ambiguous)) AS confident
    FROM r GROUP BY ALL),
p AS (  -- pos: the call's position in its group, the same on every rank for one call
    SELECT c.job, c.rank, c.pg_key, c.seq, c.sig, c.call_index - r.match_shift AS pos,
           r.ref_rank, r.n_ranks, r.by_seq
    FROM calls c JOIN r USING (job, pg_key, rank)),
bad AS (  -- positions (no seq) where some rank's call is not the reference rank's call
    SELECT DISTINCT x.job, x.pg_key, x.pos
    FROM p x JOIN p f ON f.job = x.job AND f.pg_key = x.pg_key AND f.pos = x.pos
                     AND f.rank = f.ref_rank
    WHERE NOT x.by_seq AND x.rank <> x.ref_rank AND NOT _collective_same_call(f.sig, x.sig)),
seq_ok AS (  -- sequence numbers present on every rank of their group
    SELECT job, pg_key, seq FROM p WHERE by_seq
    GROUP BY ALL HAVING count(DISTINCT rank) = any_value(n_ranks))
SELECT c.*, collective_kind(c.collective) AS kind,
       CASE WHEN collective_kind(c.collective) = 'allgather'
            THEN coalesce(c.out_bytes, c.in_bytes * c.group_size)
            ELSE coalesce(c.in_bytes, c.out_bytes) END AS bytes,
       CASE WHEN grp.by_seq AND o.seq IS NOT NULL THEN 'pg:' || r.pg_key || ':seq:' || c.seq
            WHEN NOT grp.by_seq AND x.call_index - r.match_shift BETWEEN grp.lo AND grp.hi
             AND b.pos IS NULL
            THEN 'pg:' || r.pg_key || ':call:' || (x.call_index - r.match_shift)
       END AS instance,
       grp.match, r.match_shift, r.spread_ns AS match_spread_ns, r.margin AS match_margin,
       grp.confident AS match_confident
FROM src c
JOIN c0 x ON x.job = c.job AND x.rank = c.rank AND x.pg_key = coalesce(c.pg_name, '?')
         AND x.raw_index = c.call_index
JOIN r ON r.job = c.job AND r.rank = c.rank AND r.pg_key = x.pg_key
JOIN grp ON grp.job = r.job AND grp.pg_key = r.pg_key
LEFT JOIN bad b ON b.job = c.job AND b.pg_key = r.pg_key
               AND b.pos = x.call_index - r.match_shift
LEFT JOIN seq_ok o ON o.job = c.job AND o.pg_key = r.pg_key AND o.seq = c.seq
UNION ALL BY NAME
SELECT c.*, collective_kind(c.collective) AS kind, coalesce(c.in_bytes, c.out_bytes) AS bytes,
       x.instance, 'pair' AS match, 0 AS match_shift, NULL::BIGINT AS match_spread_ns,
       NULL::DOUBLE AS match_margin, x.instance IS NOT NULL AS match_confident
FROM src c
JOIN paired x ON x.job = c.job AND x.rank = c.rank AND x.pg_key = coalesce(c.pg_name, '?')
             AND x.call_index = c.call_index;

-- @view collective_matching: how each rank's calls of each process group were matched, and
--   how well (one row per job, group and rank; `tracetool report` warns from it).
-- job, pg_name, rank. ref_rank: the group's reference rank (its lowest in the job).
-- match: 'seq', 'aligned' (this rank's calls were aligned; for the reference rank: every
--   other rank's were) or 'call_order' (no plausible alignment: matched by call index).
-- n_calls: the rank's calls in the group; n_matched: those with an instance;
--   n_unmatched = n_calls - n_matched (calls cut off by a window, or differing signatures).
-- n_paired: of n_calls, the send/recv calls paired with their peer's (match 'pair'), not
--   aligned with the group's other calls; match is 'pair' for a rank that has only those.
-- shift, spread_ns, margin: the alignment against the reference rank (collective_ranks'
--   match_shift, match_spread_ns, match_margin; NULL unless this rank was aligned).
-- ambiguous: margin < 3: another shift fits the end times almost as well, so the chosen
--   one may be wrong (its instances set no clock offsets).
CREATE OR REPLACE VIEW collective_matching WITH (DEFER_BINDING) AS
WITH r AS (
    SELECT job, coalesce(pg_name, '?') AS pg_key, any_value(pg_name) AS pg_name, rank,
           count(*) AS n_calls, count(instance) AS n_matched,
           count(*) FILTER (match = 'pair') AS n_paired,
           any_value(match) FILTER (match <> 'pair') AS group_match,
           any_value(match_shift) FILTER (match <> 'pair') AS shift,
           any_value(match_spread_ns) AS spread_ns, any_value(match_margin) AS margin
    FROM collective_ranks GROUP BY job, pg_key, rank)
SELECT job, pg_name, rank, min(rank) OVER w AS ref_rank,
       CASE WHEN group_match = 'seq' THEN 'seq' WHEN spread_ns IS NOT NULL THEN 'aligned'
            WHEN rank = min(rank) OVER w AND group_match = 'aligned' THEN 'aligned'
            WHEN group_match IS NULL THEN 'pair'
            ELSE 'call_order' END AS match,
       n_calls, n_matched, n_calls - n_matched AS n_unmatched, n_paired,
       CASE WHEN spread_ns IS NOT NULL THEN shift END AS shift, spread_ns, margin,
       coalesce(margin < 3, FALSE) AS ambiguous
FROM r WINDOW w AS (PARTITION BY job, pg_key);

-- @view _collective_matched: (private) the matched calls (collective_ranks with an
--   instance), each with its rank's clock offset; rank_clock_offsets and
--   collective_instances read it, so the matching is computed once per query.
-- All columns of collective_ranks, plus offset_ns, n_samples: see rank_clock_offsets.
CREATE OR REPLACE VIEW _collective_matched WITH (DEFER_BINDING) AS
WITH m AS MATERIALIZED (SELECT * FROM collective_ranks WHERE instance IS NOT NULL),
ref AS (SELECT job, min(rank) AS ref_rank FROM m GROUP BY job),
ref_calls AS MATERIALIZED (  -- the reference rank's calls first: joined to every rank's
                             -- calls by instance, they give one row per call (joining all
                             -- calls by instance and then keeping the reference rank's made
                             -- ranks x calls rows: 41 M at 1,024 ranks)
    SELECT m.job, m.instance, m.end_ns FROM m JOIN ref ON ref.job = m.job
                                                      AND m.rank = ref.ref_rank),
d AS (
    SELECT c.job, c.rank, c.end_ns - r.end_ns AS diff
    FROM m c JOIN ref_calls r ON r.job = c.job AND r.instance = c.instance
    WHERE c.match_confident AND c.end_ns IS NOT NULL AND r.end_ns IS NOT NULL
      AND NOT starts_with(coalesce(c.pg_name, ''), 'kernel:')  -- no call record: no clock
      AND c.match <> 'pair'),  -- a send and its receive do not end together
o AS (SELECT job, rank, quantile_disc(diff, 0.5)::BIGINT AS offset_ns,
             count(diff) AS n_samples FROM d GROUP BY ALL)
SELECT m.*, coalesce(o.offset_ns, 0) AS offset_ns, coalesce(o.n_samples, 0) AS n_samples
FROM m LEFT JOIN o USING (job, rank);

-- @view rank_clock_offsets: per-rank clock offset against the job's lowest rank with a
--   matched collective.
-- job, rank. offset_ns: median over confidently matched collectives (match_confident: seq,
--   or an unambiguous alignment) with a call record (not the kernel:<backend> groups of
--   comm kernels no call claims, whose few unsized calls align loosely), not point-to-point
--   pairs (a send and its receive do not end together), of (this rank's
--   end - the reference rank's end): all
--   ranks of a collective finish together, within its transfer jitter, so the median
--   difference estimates how far this rank's clock runs ahead. Subtract it to align
--   (events_aligned does). n_samples: collectives used. 0 for the reference rank, and for
--   a rank with no confident match (n_samples 0).
CREATE OR REPLACE VIEW rank_clock_offsets WITH (DEFER_BINDING) AS
WITH o AS (SELECT DISTINCT job, rank, offset_ns, n_samples FROM _collective_matched)
SELECT f.job, f.rank, coalesce(o.offset_ns, 0) AS offset_ns,
       coalesce(o.n_samples, 0) AS n_samples
FROM (SELECT DISTINCT job, rank FROM trace_files) f LEFT JOIN o USING (job, rank);

-- @view events_aligned: events with times moved onto the reference rank's clock.
-- All columns of events; ts_ns and end_ns minus the rank's offset_ns (rank_clock_offsets).
CREATE OR REPLACE VIEW events_aligned WITH (DEFER_BINDING) AS
SELECT e.* REPLACE (e.ts_ns - coalesce(o.offset_ns, 0) AS ts_ns,
                    e.end_ns - coalesce(o.offset_ns, 0) AS end_ns)
FROM events e LEFT JOIN rank_clock_offsets o USING (job, rank);

-- @view collective_instances: each collective call matched across the ranks of its group;
--   one row per (instance, rank), times on the aligned clock. Unmatched calls
--   (collective_ranks.instance NULL) are not here; collective_matching counts them.
-- job, instance (see collective_ranks), pg_name, collective, kind, rank, step. eid: the call's
--   row in collectives (job, rank, eid).
-- match, match_confident: how the instance was matched (collective_ranks).
-- arrival_ns, end_ns: when this rank's transfer started (kernel or gloo span) and ended.
-- dur_ns: end_ns - arrival_ns on this rank.
-- n_ranks: ranks of the job seen in this instance; group_size: ranks the group has.
-- first_arrival_ns, last_arrival_ns: over the ranks; skew_ns = last - first arrival.
-- last_rank: the rank that arrived last. wait_ns: the part of this rank's transfer before
--   the last rank arrived, min(last_arrival_ns, end_ns) - arrival_ns (0 for the last rank):
--   never more than dur_ns, so no rank waits longer than its time in collectives.
-- match_error_ns: max - min of the ranks' aligned end_ns: how well the matched calls agree
--   (a collective ends together on all ranks; broadcast roots may finish early).
-- transfer_ns: the shortest per-rank duration, i.e. the last arrival's: the transfer itself.
--   For a point-to-point pair (match 'pair'): the receive's end - the later arrival (a
--   buffered send ends before its receive is posted, and says nothing of the link).
-- bytes: collective_ranks.bytes, the message size nccl-tests calls S. algbw_gbps = bytes / transfer_ns (GB/s); busbw_gbps = algbw * factor, factor
--   2(n-1)/n for allreduce, (n-1)/n for allgather / reduce_scatter / alltoall, 1 otherwise.
CREATE OR REPLACE VIEW collective_instances WITH (DEFER_BINDING) AS
WITH c AS (
    SELECT *, ts_ns - offset_ns AS arrival_ns, end_ns - offset_ns AS aligned_end_ns
    FROM _collective_matched),
i AS (
    SELECT *,
           count(*) OVER w AS n_ranks,
           min(arrival_ns) OVER w AS first_arrival_ns,
           max(arrival_ns) OVER w AS last_arrival_ns,
           arg_max(rank, arrival_ns) OVER w AS last_rank,
           CASE WHEN match = 'pair'  -- the receive's end after the later post
                THEN greatest(0, max(CASE WHEN kind = 'recv' THEN aligned_end_ns END) OVER w
                                 - max(arrival_ns) OVER w)
                ELSE min(aligned_end_ns - arrival_ns) OVER w END AS transfer_ns,
           max(aligned_end_ns) OVER w - min(aligned_end_ns) OVER w AS match_error_ns
    FROM c WINDOW w AS (PARTITION BY job, instance))
SELECT job, instance, pg_name, collective, kind, rank, eid, step, match, match_confident,
       arrival_ns,
       aligned_end_ns AS end_ns, aligned_end_ns - arrival_ns AS dur_ns, n_ranks,
       coalesce(group_size, n_ranks) AS group_size, first_arrival_ns, last_arrival_ns,
       last_arrival_ns - first_arrival_ns AS skew_ns, last_rank,
       greatest(0, least(last_arrival_ns, aligned_end_ns) - arrival_ns) AS wait_ns,
       match_error_ns, transfer_ns, bytes,
       bytes / nullif(transfer_ns, 0) AS algbw_gbps,
       bytes / nullif(transfer_ns, 0) * (
           CASE WHEN kind = 'allreduce'
                THEN 2.0 * (coalesce(group_size, n_ranks) - 1) / coalesce(group_size, n_ranks)
                WHEN kind IN ('allgather', 'reduce_scatter', 'all_to_all')
                THEN 1.0 * (coalesce(group_size, n_ranks) - 1) / coalesce(group_size, n_ranks)
                ELSE 1.0 END) AS busbw_gbps
FROM i;

-- @view stragglers: which ranks make the others wait at collectives, and what they were
--   doing just before.
-- job, rank. instances: matched collectives (with at least 2 ranks) this rank took part in.
-- times_last: how often it arrived last; share_last = times_last / instances.
-- caused_wait_ns: when it was last, the summed wait of the other ranks.
-- mean_lateness_ns: when last, mean of (its arrival - the second-to-last arrival).
-- top_op_before: the GPU kernel (CPU op on CPU-only ranks) with the most time in the
--   windows before its late arrivals (from its previous collective's end to the arrival).
CREATE OR REPLACE VIEW stragglers WITH (DEFER_BINDING) AS
WITH ci AS MATERIALIZED (SELECT * FROM collective_instances WHERE n_ranks > 1),
late AS (
    SELECT a.job, a.rank, a.eid, a.instance, a.arrival_ns,
           (SELECT sum(b.wait_ns) FROM ci b WHERE b.job = a.job AND b.instance = a.instance)
               AS caused,
           a.arrival_ns - (SELECT max(b.arrival_ns) FROM ci b WHERE b.job = a.job
                           AND b.instance = a.instance AND b.rank <> a.rank) AS lateness
    FROM ci a WHERE a.rank = a.last_rank),
prev AS (  -- this rank's previous collective end (matched or not), on its own clock
    SELECT c.job, c.rank, c.eid, c.ts_ns AS arrival_raw,
           lag(c.end_ns) OVER (PARTITION BY c.job, c.rank ORDER BY c.ts_ns) AS prev_end
    FROM collectives c),
windows AS (
    SELECT l.job, l.rank, coalesce(p.prev_end, p.arrival_raw) AS w0, p.arrival_raw AS w1
    FROM late l JOIN prev p USING (job, rank, eid)),
busy AS (
    SELECT w.job, w.rank, e.name,
           sum(least(e.end_ns, w.w1) - greatest(e.ts_ns, w.w0)) AS ns
    FROM windows w JOIN events e ON e.job = w.job AND e.rank = w.rank
     AND e.ts_ns < w.w1 AND e.end_ns > w.w0
    LEFT JOIN (SELECT job, rank, eid FROM events WHERE kind = 'cpu_op') pe  -- parent cpu_op
      ON pe.job = e.job AND pe.rank = e.rank AND pe.eid = e.parent_eid
    WHERE e.ph = 'X' AND (e.kind = 'kernel' OR (e.kind = 'cpu_op' AND pe.eid IS NULL))
    GROUP BY ALL),
top AS (SELECT job, rank, arg_max(name, ns) AS top_op_before FROM busy GROUP BY ALL),
per_rank AS (SELECT job, rank, count(*) AS instances FROM ci GROUP BY ALL),
late_rank AS (SELECT job, rank, count(*) AS times_last, sum(caused) AS caused_wait_ns,
                     avg(lateness) AS mean_lateness_ns FROM late GROUP BY ALL)
SELECT p.job, p.rank, p.instances, coalesce(l.times_last, 0) AS times_last,
       coalesce(l.times_last, 0) / p.instances AS share_last,
       coalesce(l.caused_wait_ns, 0)::BIGINT AS caused_wait_ns,
       l.mean_lateness_ns::BIGINT AS mean_lateness_ns, t.top_op_before
FROM per_rank p LEFT JOIN late_rank l USING (job, rank) LEFT JOIN top t USING (job, rank);
