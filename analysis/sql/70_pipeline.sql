-- Pipeline parallelism: the stages, microbatches and bubbles of a pipeline, found from its
-- point-to-point pattern alone (docs/pipeline.md has the rules and a worked example).
-- Needs: collective_ranks (40_collectives.sql), steps (05_steps.sql), interval_unions
-- (25_intervals.sql).

-- @view pipeline_stages: the pipelines of each job, one row per rank in one. A pipeline is
--   a chain of ranks linked by point-to-point calls (collective_ranks kind send or recv with
--   a peer_rank: gloo's c10d::send / c10d::recv_, NCCL's send/recv): every rank of it has
--   one or two such peers, two ends. Its first stage is the end whose first point-to-point
--   call of every step is a send (the first stage has no input to wait for: it sends its
--   first activation; the last stage's first call receives one), so the stages are ordered
--   the way the activations go. A chain whose two ends both begin their steps with a send,
--   or neither, is not a pipeline here, nor is a ring or a rank with three peers.
-- job, rank. pipeline: the rank of the pipeline's first stage (its id: a job with data and
--   pipeline parallelism has several). stage: 0 for the first stage, n_stages - 1 for the
--   last. n_stages: the pipeline's ranks. prev_rank, next_rank: the ranks of the stages
--   before and after (NULL at the ends).
CREATE OR REPLACE VIEW pipeline_stages WITH (DEFER_BINDING) AS
WITH RECURSIVE p2p AS MATERIALIZED (
    SELECT job, rank, peer_rank AS peer, kind, step, cpu_ts_ns
    FROM collective_ranks
    WHERE kind IN ('send', 'recv') AND peer_rank IS NOT NULL AND peer_rank <> rank),
nbr AS (SELECT DISTINCT job, rank, peer FROM p2p
        UNION SELECT DISTINCT job, peer AS rank, rank AS peer FROM p2p),
deg AS (SELECT job, rank, count(*) AS n FROM nbr GROUP BY ALL),
n_job AS (SELECT job, count(*) AS n FROM deg GROUP BY ALL),
firsts AS (  -- each rank's first point-to-point call of each step
    SELECT job, rank, step, arg_min(kind, cpu_ts_ns) AS first_kind
    FROM p2p WHERE step IS NOT NULL GROUP BY ALL),
heads AS (
    SELECT d.job, d.rank FROM deg d JOIN firsts f USING (job, rank)
    WHERE d.n = 1 GROUP BY ALL HAVING bool_and(f.first_kind = 'send')),
chain AS (  -- walk from each head to the other end
    SELECT job, rank AS pipeline, rank, NULL::BIGINT AS prev, 0 AS stage FROM heads
    UNION ALL
    SELECT c.job, c.pipeline, n.peer, c.rank, c.stage + 1
    FROM chain c JOIN nbr n ON n.job = c.job AND n.rank = c.rank
    JOIN n_job j ON j.job = c.job
    WHERE n.peer IS DISTINCT FROM c.prev AND c.stage < j.n),
valid AS (
    SELECT c.job, c.pipeline FROM chain c
    JOIN deg d ON d.job = c.job AND d.rank = c.rank
    LEFT JOIN heads h ON h.job = c.job AND h.rank = c.rank
    GROUP BY ALL
    HAVING count(*) = count(DISTINCT c.rank) AND max(d.n) <= 2 AND count(*) >= 2
       AND count(*) FILTER (WHERE d.n = 1) = 2 AND count(h.rank) = 1)
SELECT c.job, c.rank::INTEGER AS rank, c.pipeline::INTEGER AS pipeline, c.stage::INTEGER AS stage,
       (count(*) OVER w)::INTEGER AS n_stages,
       (lag(c.rank) OVER (w ORDER BY c.stage))::INTEGER AS prev_rank,
       (lead(c.rank) OVER (w ORDER BY c.stage))::INTEGER AS next_rank
FROM chain c SEMI JOIN valid v ON v.job = c.job AND v.pipeline = c.pipeline
WINDOW w AS (PARTITION BY c.job, c.pipeline);

-- @view pipeline_calls: each point-to-point call of a pipeline stage, with what it carries.
-- job, rank, step (collective_ranks.step: the ProfilerStep the call was made in),
--   pipeline, stage, n_stages: as in pipeline_stages. eid: the call (collectives.eid).
-- kind: send or recv. peer_rank: the other stage.
-- direction: 'forward' for activations (a send to the next stage, a receive from the
--   previous one), 'backward' for gradients (the other way).
-- microbatch: 0, 1, ...: the call's place among the stage's calls of its kind and direction
--   in the step (a stage sends and receives its microbatches in order).
-- bytes: collective_ranks.bytes (the tensor's size; NULL when the trace has no shapes).
-- call_start_ns, call_end_ns: the call on the CPU (the c10d op or record_param_comms).
-- transfer_start_ns, transfer_end_ns: its transfer (the gloo:send / gloo:recv span, or the
--   NCCL kernel).
-- block_start_ns, block_end_ns: the time the stage is held by the call, waiting for its
--   neighbour or the data. On a GPU rank (the call has a kernel): the kernel. On a CPU rank:
--   a receive from its call's start to its transfer's end; a send likewise when it was
--   waited for before the next chunk: its transfer ended before the stage's next send of
--   the step began (a blocking send, or an isend posted with a receive and waited for with
--   it, as Megatron batches them), or, for the step's last send, before the stage's next
--   call ended (none: the step's end); else only its call (an isend still in flight over
--   the next chunk, waited for later).
CREATE OR REPLACE VIEW pipeline_calls WITH (DEFER_BINDING) AS
WITH c AS (
    SELECT r.job, r.rank, r.step, s.pipeline, s.stage, s.n_stages, r.eid, r.kind,
           r.peer_rank, r.bytes, r.kernel_eid IS NOT NULL AS on_gpu,
           r.cpu_ts_ns AS call_start_ns,
           r.cpu_ts_ns + coalesce(r.cpu_dur_ns, 0) AS call_end_ns,
           r.ts_ns AS transfer_start_ns, r.end_ns AS transfer_end_ns,
           CASE WHEN (r.kind = 'send') = coalesce(r.peer_rank = s.next_rank, FALSE) THEN 'forward'
                ELSE 'backward' END AS direction,
           lead(r.cpu_ts_ns) OVER (PARTITION BY r.job, r.rank, r.step, r.kind
                                   ORDER BY r.cpu_ts_ns, r.eid) AS next_same_ns,
           lead(greatest(r.cpu_ts_ns + coalesce(r.cpu_dur_ns, 0), r.end_ns)) OVER (
               PARTITION BY r.job, r.rank, r.step ORDER BY r.cpu_ts_ns, r.eid) AS next_end_ns
    FROM collective_ranks r
    JOIN pipeline_stages s ON s.job = r.job AND s.rank = r.rank
    WHERE r.kind IN ('send', 'recv')
      AND r.peer_rank IN (s.prev_rank, s.next_rank) AND r.step IS NOT NULL)
SELECT job, rank, step, pipeline, stage, n_stages, eid, kind, peer_rank, direction,
       (row_number() OVER (PARTITION BY job, rank, step, kind, direction
                           ORDER BY call_start_ns, eid) - 1)::INTEGER AS microbatch,
       bytes, call_start_ns, call_end_ns, transfer_start_ns, transfer_end_ns,
       CASE WHEN on_gpu THEN transfer_start_ns ELSE call_start_ns END AS block_start_ns,
       CASE WHEN on_gpu THEN transfer_end_ns
            WHEN kind = 'recv'
                 OR transfer_end_ns <= coalesce(next_same_ns, next_end_ns, transfer_end_ns)
            THEN greatest(call_end_ns, coalesce(transfer_end_ns, call_end_ns))
            ELSE call_end_ns END AS block_end_ns
FROM c;

-- @view pipeline_waits: the time each pipeline stage is held by communication, as
--   intervals of its steps (for interval_unions): its point-to-point calls (pipeline_calls'
--   block_start_ns to block_end_ns) and its other collectives (a loss allreduce that ends
--   the step waits there for the last chunk of the pipeline: the drain shows there; a data-
--   parallel gradient allreduce too): on a GPU rank the kernel, on a CPU rank the call's
--   start to its transfer's end. Clipped to the rank's step (steps).
-- job, rank, step; s_ns, e_ns: the interval; what: 'comm'. source: 'p2p' or 'collective'.
CREATE OR REPLACE VIEW pipeline_waits WITH (DEFER_BINDING) AS
WITH w AS (
    SELECT job, rank, block_start_ns, block_end_ns, 'p2p' AS source FROM pipeline_calls
    UNION ALL
    SELECT r.job, r.rank,
           CASE WHEN r.kernel_eid IS NOT NULL THEN r.ts_ns ELSE r.cpu_ts_ns END,
           CASE WHEN r.kernel_eid IS NOT NULL THEN r.end_ns
                ELSE greatest(r.cpu_ts_ns + coalesce(r.cpu_dur_ns, 0),
                              coalesce(r.end_ns, r.cpu_ts_ns)) END, 'collective'
    FROM collective_ranks r SEMI JOIN pipeline_stages p ON p.job = r.job AND p.rank = r.rank
    WHERE r.kind NOT IN ('send', 'recv'))
SELECT w.job, w.rank, s.step, greatest(w.block_start_ns, s.start_ns) AS s_ns,
       least(w.block_end_ns, s.end_ns) AS e_ns, 'comm' AS what, w.source
FROM w
JOIN steps s ON s.job = w.job AND s.rank = w.rank
            AND w.block_start_ns < s.end_ns AND w.block_end_ns > s.start_ns;

-- @view pipeline_bubbles: how much of each step each pipeline stage waited: one row per
--   stage and step.
-- job, pipeline, stage, n_stages, rank, step; complete: steps.complete.
-- dur_ns: the rank's step (steps.dur_ns).
-- bubble_ns: the time the stage was held by communication (pipeline_waits, the union):
--   waiting for an activation or a gradient (the transfer included), or in a collective
--   (the pipeline's drain, when a loss allreduce ends the step). busy_ns:
--   dur_ns - bubble_ns, the stage's own work (its compute, the CPU time around it, the
--   optimizer). bubble_share: bubble_ns / dur_ns.
-- microbatches: the stage's forward chunks in the step: its forward sends (the last stage:
--   its forward receives).
-- chunk_order: the stage's forward (F) and backward (B) chunks in the order it ran them, e.g.
--   'FFFFBBBB'. A forward chunk is placed at its activation's send (the last stage: at its
--   receive's end), a backward chunk at its gradient's send (the first stage: at its
--   receive's end).
-- stage_schedule: 'gpipe' when chunk_order is every forward then every backward, '1f1b'
--   when it is min(n_stages - stage - 1, microbatches) forwards, then alternately one forward
--   and one backward, then the remaining backwards; 'both' when the two orders are the same
--   (one microbatch, or a stage whose warm-up covers them all), 'forward_only' with no
--   backward chunk, else 'other'.
-- schedule: the pipeline's schedule in this step: 'gpipe' or '1f1b' when every stage's
--   order is that one's (and not every stage's both), 'both' when every stage's is both,
--   'forward_only' when no stage has a backward chunk, else 'other'.
CREATE OR REPLACE VIEW pipeline_bubbles WITH (DEFER_BINDING) AS
WITH waits AS (SELECT * FROM interval_unions('pipeline_waits')),
chunks AS (
    SELECT job, rank, step, pipeline, stage, n_stages,
           count(*) FILTER (WHERE direction = 'forward'
                                  AND (kind = 'send' OR stage = n_stages - 1)) AS microbatches,
           count(*) FILTER (WHERE direction = 'backward'
                                  AND (kind = 'send' OR stage = 0)) AS n_backward,
           string_agg(CASE direction WHEN 'forward' THEN 'F' ELSE 'B' END, ''
                      ORDER BY CASE WHEN kind = 'send' THEN block_start_ns
                                    ELSE block_end_ns END, eid)
               FILTER (WHERE kind = 'send'
                          OR (direction = 'forward' AND stage = n_stages - 1)
                          OR (direction = 'backward' AND stage = 0)) AS chunk_order
    FROM pipeline_calls GROUP BY ALL),
per_stage AS (
    SELECT c.*, least(n_stages - stage - 1, microbatches) AS warm,
           repeat('F', microbatches) || repeat('B', n_backward) AS gpipe_order,
           repeat('F', least(n_stages - stage - 1, microbatches))
           || repeat('FB', microbatches - least(n_stages - stage - 1, microbatches))
           || repeat('B', least(n_stages - stage - 1, microbatches)) AS f1b_order
    FROM chunks c),
judged AS (
    SELECT *, CASE WHEN n_backward = 0 THEN 'forward_only'
                   WHEN n_backward <> microbatches THEN 'other'
                   WHEN chunk_order = gpipe_order AND chunk_order = f1b_order THEN 'both'
                   WHEN chunk_order = gpipe_order THEN 'gpipe'
                   WHEN chunk_order = f1b_order THEN '1f1b'
                   ELSE 'other' END AS stage_schedule
    FROM per_stage),
pipe AS (
    SELECT job, pipeline, step,
           CASE WHEN bool_and(stage_schedule = 'forward_only') THEN 'forward_only'
                WHEN bool_and(stage_schedule = 'both') THEN 'both'
                WHEN bool_and(stage_schedule IN ('gpipe', 'both')) THEN 'gpipe'
                WHEN bool_and(stage_schedule IN ('1f1b', 'both')) THEN '1f1b'
                ELSE 'other' END AS schedule
    FROM judged GROUP BY ALL)
SELECT s.job, j.pipeline, j.stage, j.n_stages, s.rank, s.step, s.complete, s.dur_ns,
       (s.dur_ns - coalesce(w.comm, 0))::BIGINT AS busy_ns,
       coalesce(w.comm, 0)::BIGINT AS bubble_ns,
       CASE WHEN s.dur_ns > 0 THEN coalesce(w.comm, 0) / s.dur_ns END AS bubble_share,
       j.microbatches::INTEGER AS microbatches, j.chunk_order, j.stage_schedule, p.schedule
FROM judged j
JOIN steps s ON s.job = j.job AND s.rank = j.rank AND s.step = j.step
JOIN pipe p ON p.job = j.job AND p.pipeline = j.pipeline AND p.step = j.step
LEFT JOIN waits w ON w.jh = hash(s.job) AND w.rank = s.rank AND w.step = s.step
ORDER BY s.job, j.pipeline, s.step, j.stage;
