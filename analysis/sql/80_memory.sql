-- Device and host memory over time, from the allocator's `[memory]` instants (PyTorch's
-- profile_memory=True: one instant per allocation or free, on the thread that made it, args
-- Bytes (+ allocated, - freed), Addr, Device Type, Device Id and, since PyTorch 1.10 or so,
-- Total Allocated / Total Reserved after the event). The PyTorch memory profiler's and HTA's
-- questions: how much was allocated over a step, its peak per step and rank, and what held
-- the memory at the peak.

-- @view memory_timeline: one row per allocator event, with the memory level after it.
-- job, rank, eid: the `[memory]` instant (events.eid). tid: the thread that allocated.
-- ts_ns: when.
-- device_type: the allocator's device as c10::DeviceType numbers it, named: 'cpu' (0),
--   'cuda' (1; ROCm builds report their GPUs as cuda too), 'hip' (6), 'xpu' (12), 'mps'
--   (13), 'mtia' (19), else 'type N'. device: args 'Device Id' (-1 for the host).
-- addr: args Addr (NULL in traces that do not record it). bytes: args Bytes, > 0 an
--   allocation, < 0 a free.
-- allocated_bytes: args 'Total Allocated' after the event where the trace records it; else
--   (older traces) the running sum of bytes over the rank's device from its first event, so
--   relative to an unknown level at the trace's start (relative = TRUE).
-- reserved_bytes: args 'Total Reserved' (the caching allocator's reserve), NULL when absent.
-- relative: TRUE when allocated_bytes is the running sum, not the allocator's total.
-- op_eid, op_name: the slice enclosing the event on its thread (events.parent_eid: the
--   innermost op, e.g. aten::empty), NULL outside any slice. top_op_eid, top_op_name: the
--   outermost CPU operator (cpu_ops, ProfilerStep#N left out) on the thread that contains
--   the event (e.g. aten::linear, or a module's op), NULL when none does.
-- step: the per-rank step (steps) the event lies in, NULL outside every step.
CREATE OR REPLACE VIEW memory_timeline WITH (DEFER_BINDING) AS
WITH m AS MATERIALIZED (
    SELECT job, rank, eid, tid, ts_ns, parent_eid, args::JSON AS a
    FROM events WHERE name = '[memory]' AND ph = 'i'),
v AS (
    SELECT job, rank, eid, tid, ts_ns, parent_eid,
           TRY_CAST(a ->> '$."Device Type"' AS INTEGER) AS type_no,
           TRY_CAST(a ->> '$."Device Id"' AS INTEGER) AS device,
           TRY_CAST(a ->> '$.Addr' AS HUGEINT) AS addr,
           TRY_CAST(a ->> '$.Bytes' AS BIGINT) AS bytes,
           TRY_CAST(a ->> '$."Total Allocated"' AS BIGINT) AS total_allocated,
           TRY_CAST(a ->> '$."Total Reserved"' AS BIGINT) AS reserved_bytes
    FROM m),
named AS (
    SELECT *, CASE type_no WHEN 0 THEN 'cpu' WHEN 1 THEN 'cuda' WHEN 6 THEN 'hip'
                           WHEN 12 THEN 'xpu' WHEN 13 THEN 'mps' WHEN 19 THEN 'mtia'
                           ELSE 'type ' || coalesce(type_no::VARCHAR, '?') END AS device_type
    FROM v),
lvl AS (
    SELECT *,
           coalesce(total_allocated,
                    sum(bytes) OVER (PARTITION BY job, rank, device_type, device
                                     ORDER BY ts_ns, eid ROWS UNBOUNDED PRECEDING))
               AS allocated_bytes,
           total_allocated IS NULL AS relative
    FROM named),
top AS (  -- the outermost CPU op around each event on its thread (not a step annotation,
           -- which traces before 2022 write as an Operator)
    SELECT l.job, l.rank, l.eid, arg_min(o.eid, o.depth) AS top_op_eid,
           arg_min(o.name, o.depth) AS top_op_name
    FROM lvl l JOIN cpu_ops o
      ON o.job = l.job AND o.rank = l.rank AND o.tid = l.tid
     AND o.ts_ns <= l.ts_ns AND l.ts_ns < o.end_ns
    WHERE NOT starts_with(o.name, 'ProfilerStep#')
    GROUP BY l.job, l.rank, l.eid)
SELECT l.job, l.rank, l.eid, l.tid, l.ts_ns, l.device_type, l.device, l.addr, l.bytes,
       l.allocated_bytes, l.reserved_bytes, l.relative,
       l.parent_eid AS op_eid, p.name AS op_name, t.top_op_eid, t.top_op_name,
       CASE WHEN l.ts_ns < s.end_ns THEN s.step END AS step
FROM lvl l
LEFT JOIN events p ON p.job = l.job AND p.rank = l.rank AND p.eid = l.parent_eid
LEFT JOIN top t ON t.job = l.job AND t.rank = l.rank AND t.eid = l.eid
ASOF LEFT JOIN (SELECT job, rank, step, start_ns, end_ns FROM steps) s
  ON l.job = s.job AND l.rank = s.rank AND l.ts_ns >= s.start_ns;

-- @view memory_allocations: each allocation matched with its free, for the traces that
--   record addresses: the allocation is the event with bytes > 0, its free the next event
--   at the same (job, rank, device_type, device, addr) when that one has bytes < 0.
-- job, rank, device_type, device, addr, bytes: as in memory_timeline (bytes > 0).
-- alloc_eid, alloc_ns: the allocation. free_eid, free_ns: its free, NULL when the trace
--   ends with it still allocated.
-- op_name, top_op_name, step: memory_timeline's, at the allocation.
CREATE OR REPLACE VIEW memory_allocations WITH (DEFER_BINDING) AS
WITH t AS (
    SELECT *,
           lead(eid) OVER w AS next_eid, lead(ts_ns) OVER w AS next_ns,
           lead(bytes) OVER w AS next_bytes
    FROM memory_timeline WHERE addr IS NOT NULL
    WINDOW w AS (PARTITION BY job, rank, device_type, device, addr ORDER BY ts_ns, eid))
SELECT job, rank, device_type, device, addr, bytes, eid AS alloc_eid, ts_ns AS alloc_ns,
       CASE WHEN next_bytes < 0 THEN next_eid END AS free_eid,
       CASE WHEN next_bytes < 0 THEN next_ns END AS free_ns,
       op_name, top_op_name, step
FROM t WHERE bytes > 0;

-- @view memory_peaks: the peak of allocated memory per rank, device and step.
-- job, rank, device_type, device, step: as in memory_timeline (step NULL: the events
--   outside every step, together).
-- n_events: allocator events in the step. peak_allocated_bytes: the highest
--   memory_timeline.allocated_bytes in it; peak_ns, peak_eid: the first event reaching it.
--   peak_op_name, peak_top_op_name: the ops around that event.
-- start_allocated_bytes: allocated before the step's first event (that event's level
--   minus its bytes). end_allocated_bytes: after its last event.
-- peak_reserved_bytes: the highest reserved_bytes in the step, NULL when not recorded.
-- relative: TRUE when the levels are running sums (memory_timeline.relative).
-- live_at_peak_bytes: bytes of allocations made in this trace and still held at the peak
--   (memory_allocations: allocated at or before peak_ns, freed after it or never); NULL
--   when the trace records no addresses. The rest of peak_allocated_bytes was allocated
--   before the trace began (weights, optimizer state, the cache).
CREATE OR REPLACE VIEW memory_peaks WITH (DEFER_BINDING) AS
WITH p AS (
    SELECT job, rank, device_type, device, step, count(*) AS n_events,
           max(allocated_bytes) AS peak_allocated_bytes,
           arg_min(ts_ns, CASE WHEN allocated_bytes IS NOT NULL
                               THEN (-allocated_bytes, ts_ns, eid) END) AS peak_ns,
           arg_min(eid, CASE WHEN allocated_bytes IS NOT NULL
                             THEN (-allocated_bytes, ts_ns, eid) END) AS peak_eid,
           arg_min(allocated_bytes - bytes, (ts_ns, eid)) AS start_allocated_bytes,
           arg_max(allocated_bytes, (ts_ns, eid)) AS end_allocated_bytes,
           max(reserved_bytes) AS peak_reserved_bytes, bool_or(relative) AS relative,
           bool_or(addr IS NOT NULL) AS has_addr
    FROM memory_timeline GROUP BY ALL),
live AS (
    SELECT p.job, p.rank, p.device_type, p.device, p.step, sum(a.bytes) AS live_bytes
    FROM p JOIN memory_allocations a
      ON a.job = p.job AND a.rank = p.rank AND a.device_type = p.device_type
     AND a.device IS NOT DISTINCT FROM p.device
     AND a.alloc_ns <= p.peak_ns AND (a.free_ns IS NULL OR a.free_ns > p.peak_ns)
    GROUP BY ALL)
SELECT p.job, p.rank, p.device_type, p.device, p.step, p.n_events, p.peak_allocated_bytes,
       p.peak_ns, p.peak_eid, t.op_name AS peak_op_name, t.top_op_name AS peak_top_op_name,
       p.start_allocated_bytes, p.end_allocated_bytes, p.peak_reserved_bytes, p.relative,
       CASE WHEN p.has_addr THEN coalesce(l.live_bytes, 0) END::BIGINT AS live_at_peak_bytes
FROM p
LEFT JOIN memory_timeline t ON t.job = p.job AND t.rank = p.rank AND t.eid = p.peak_eid
LEFT JOIN live l ON l.job = p.job AND l.rank = p.rank AND l.device_type = p.device_type
                AND l.device IS NOT DISTINCT FROM p.device
                AND l.step IS NOT DISTINCT FROM p.step;

-- @view memory_live_at_peak: what held the memory at each memory_peaks peak: the
--   allocations made in this trace and live at peak_ns, grouped by the ops that made them.
-- job, rank, device_type, device, step: the peak's (memory_peaks).
-- top_op_name, op_name: memory_allocations' (the outermost CPU op and the innermost slice at
--   the allocation; the allocation may come from an earlier step).
-- n_allocations, bytes: how many allocations, and their bytes, live at the peak.
CREATE OR REPLACE VIEW memory_live_at_peak WITH (DEFER_BINDING) AS
SELECT p.job, p.rank, p.device_type, p.device, p.step, a.top_op_name, a.op_name,
       count(*) AS n_allocations, sum(a.bytes)::BIGINT AS bytes
FROM memory_peaks p JOIN memory_allocations a
  ON a.job = p.job AND a.rank = p.rank AND a.device_type = p.device_type
 AND a.device IS NOT DISTINCT FROM p.device
 AND a.alloc_ns <= p.peak_ns AND (a.free_ns IS NULL OR a.free_ns > p.peak_ns)
GROUP BY ALL;
