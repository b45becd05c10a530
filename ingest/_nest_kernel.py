"""The compiled merge of slices and flows behind ``nesting.nest_and_bind`` (numba)."""

from __future__ import annotations

from numba import njit

NEED_SLICES, NEED_FLOWS, NEED_STACK, DONE = range(4)


@njit(cache=True)
def _close_before(t, st_start, st_end, sp):  # noqa: ANN001, ANN202  # pragma: no cover
    """Pop slices over by time t ([start, end) half-open; zero-length at t stays)."""
    while sp > 0 and (st_end[sp - 1] < t or (st_end[sp - 1] == t
                                             and st_start[sp - 1] < st_end[sp - 1])):
        sp -= 1
    return sp


@njit(cache=True)
def merge(sl_track, sl_ts, sl_dur, sl_eid, i, slices_done,  # noqa: ANN001, ANN202, PLR0913
           fl_track, fl_ts, fl_eid, fl_nxt, fl_bound, j, flows_done,
           st_start, st_end, st_eid, state, depth, parent, overlap):  # pragma: no cover
    """Merge sorted slices and flows from positions i and j until a batch runs out.
    state = [stack size, current track]. Returns (status, i, j)."""
    ns, nf, cap = len(sl_eid), len(fl_eid), len(st_eid)
    sp, cur = state[0], state[1]
    status = DONE
    while True:
        if j < nf and (i < ns or slices_done):
            ft, t = fl_track[j], fl_ts[j]
            if i >= ns or ft < sl_track[i] or (ft == sl_track[i] and t < sl_ts[i]):
                found = -1
                if cur == ft:
                    if fl_nxt[j]:
                        # the first slice to begin at or after t: one already open that
                        # began at t (the outermost such), else the upcoming one
                        for m in range(sp - 1, -1, -1):
                            if st_start[m] != t:
                                break
                            found = st_eid[m]
                    else:
                        sp = _close_before(t, st_start, st_end, sp)
                        if sp > 0:
                            found = st_eid[sp - 1]
                if found < 0 and fl_nxt[j] and i < ns and sl_track[i] == ft:
                    found = sl_eid[i]
                fl_bound[j] = found
                j += 1
                continue
        elif j >= nf and not flows_done:
            status = NEED_FLOWS
            break
        if i >= ns:
            status = DONE if slices_done else NEED_SLICES
            if j < nf and slices_done:
                continue
            break
        if sp == cap:
            status = NEED_STACK
            break
        track, s, eid = sl_track[i], sl_ts[i], sl_eid[i]
        if track != cur:
            sp = 0
            cur = track
        sp = _close_before(s, st_start, st_end, sp)
        e = s + sl_dur[i]
        if sp > 0:
            parent[eid] = st_eid[sp - 1]
            overlap[eid] = e > st_end[sp - 1]
        depth[eid] = sp
        st_start[sp] = s
        st_end[sp] = e
        st_eid[sp] = eid
        sp += 1
        i += 1
    state[0] = sp
    state[1] = cur
    return status, i, j
