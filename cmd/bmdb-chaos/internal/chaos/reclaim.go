package chaos

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Reclaim: how long a dead worker's machines wait to be worked again.
//
// For each claim of a dead session (one its session never ended: the
// Abandoned row of a takeover, of GC, or of a Close after expiry), the
// reclaim is the time from the session's final deadline on the database
// clock (chaos_session_log) to the commit of the machine's next Started
// row (work_history, commit timestamp), counting only the time during
// which free machines remained: some item was claimable, that is created
// (its row committed), not done (no effect committed), not claimed (no
// claim of any session, live or dead, between its Started and its end's
// commits) and not in backoff (between its Failed's commit and the until
// that transaction wrote, chaos_backoff_log). A queue of free machines is
// what reclaim must not wait for (bmdb takes a dead session's claims over
// at the first claim statement that meets them, and sweeps every claim of
// the process each quarter interval); while none is free, the fleet's
// handlers are all busy or idle, and the time is not counted.

// reclaim is one dead claim's machine and when it was worked again.
type reclaim struct {
	machine, session uuid.UUID
	deadline         time.Time     // the session's final deadline
	started          time.Time     // the commit of the machine's next Started
	counted          time.Duration // started - deadline, less the time no machine was free
}

// reclaims returns the reclaim of every claim of a dead session in events
// (by machine, then id) whose machine was claimed again, and, if any,
// the claims whose session has no recorded deadline.
func reclaims(events []dbEvent, final map[uuid.UUID]time.Time, noneFree outageWindows) (out []reclaim, unknown []uuid.UUID) {
	for i := range events {
		e := &events[i]
		if e.event != "Abandoned" {
			continue
		}
		d, ok := final[e.session]
		if !ok {
			unknown = append(unknown, e.claim)
			continue
		}
		for j := i + 1; j < len(events) && events[j].machine == e.machine; j++ {
			if n := &events[j]; n.event == "Started" {
				wall := n.commit.Sub(d)
				out = append(out, reclaim{machine: e.machine, session: e.session, deadline: d, started: n.commit,
					counted: max(wall-noneFree.overlap(d, n.commit), 0)})
				break
			}
		}
	}
	return out, unknown
}

// noneFree returns the windows, on the database clock, in which no item
// was free (see above), from the items' rows, the effects, the history
// events (by machine, then id) and the backoffs' untils.
func (h *harness) noneFree(ctx context.Context, events []dbEvent) (outageWindows, error) {
	created, err := h.commitTimes(ctx, `SELECT machine_id, pg_xact_commit_timestamp(xmin) FROM machines`)
	if err != nil {
		return nil, err
	}
	done, err := h.commitTimes(ctx, `SELECT machine_id, min(pg_xact_commit_timestamp(xmin)) FROM chaos_effect GROUP BY machine_id`)
	if err != nil {
		return nil, err
	}
	until, err := h.backoffUntils(ctx)
	if err != nil {
		return nil, err
	}
	return freeWindows(created, done, until, events).none(), nil
}

// commitTimes runs query, which returns machine ids and times.
func (h *harness) commitTimes(ctx context.Context, query string) (map[uuid.UUID]time.Time, error) {
	rows, err := h.db.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading commit times: %w", err)
	}
	defer rows.Close()
	m := map[uuid.UUID]time.Time{}
	for rows.Next() {
		var id uuid.UUID
		var t time.Time
		if err := rows.Scan(&id, &t); err != nil {
			return nil, fmt.Errorf("chaos: reading commit times (track_commit_timestamp off?): %w", err)
		}
		m[id] = t
	}
	return m, rows.Err()
}

// backoffKey is a backoff's machine and writing transaction.
type backoffKey struct {
	machine uuid.UUID
	xid     string
}

// backoffUntils returns the until of every backoff of Process written, by
// machine and transaction (the Fail's, which wrote its Failed row).
func (h *harness) backoffUntils(ctx context.Context) (map[backoffKey]time.Time, error) {
	rows, err := h.db.QueryContext(ctx, `SELECT machine_id, xmin::TEXT, until FROM chaos_backoff_log WHERE process = $1`, Process)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading backoffs: %w", err)
	}
	defer rows.Close()
	m := map[backoffKey]time.Time{}
	for rows.Next() {
		var k backoffKey
		var t time.Time
		if err := rows.Scan(&k.machine, &k.xid, &t); err != nil {
			return nil, err
		}
		m[k] = t
	}
	return m, rows.Err()
}

// freeCount is how many items were free, as a step function: at each
// change, the count from then on.
type freeCount []struct {
	at time.Time
	n  int
}

// never is a time after every run.
var never = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// freeWindows computes the free count from each item's creation and done
// commits, its claims (events, by machine, then id: each Started to the
// commit of its claim's end, or for ever) and its backoffs (each Failed
// commit to the until its transaction wrote).
func freeWindows(created, done map[uuid.UUID]time.Time, until map[backoffKey]time.Time, events []dbEvent) freeCount {
	type span struct{ from, to time.Time }
	busy := map[uuid.UUID][]span{}
	ends := map[uuid.UUID]time.Time{} // claim -> its end's commit
	for _, e := range events {
		if e.event != "Started" {
			ends[e.claim] = e.commit
		}
	}
	for _, e := range events {
		switch e.event {
		case "Started":
			to, ok := ends[e.claim]
			if !ok {
				to = never
			}
			busy[e.machine] = append(busy[e.machine], span{e.commit, to})
		case "Failed":
			if u, ok := until[backoffKey{e.machine, e.xid}]; ok && u.After(e.commit) {
				busy[e.machine] = append(busy[e.machine], span{e.commit, u})
			}
		}
	}
	type change struct {
		at    time.Time
		delta int
	}
	var changes []change
	for m, from := range created {
		to, ok := done[m]
		if !ok {
			to = never
		}
		spans := busy[m]
		sort.Slice(spans, func(i, j int) bool { return spans[i].from.Before(spans[j].from) })
		at := from // free from here, until the next busy span
		for _, s := range spans {
			if s.from.After(at) {
				end := minTime(s.from, to)
				if end.After(at) {
					changes = append(changes, change{at, 1}, change{end, -1})
				}
			}
			if s.to.After(at) {
				at = s.to
			}
		}
		if to.After(at) {
			changes = append(changes, change{at, 1}, change{to, -1})
		}
	}
	// At the same instant, becoming free comes first: the count does not
	// drop to zero between one item's claim and another's end.
	sort.Slice(changes, func(i, j int) bool {
		if !changes[i].at.Equal(changes[j].at) {
			return changes[i].at.Before(changes[j].at)
		}
		return changes[i].delta > changes[j].delta
	})
	var fc freeCount
	n := 0
	for _, c := range changes {
		n += c.delta
		if len(fc) > 0 && fc[len(fc)-1].at.Equal(c.at) {
			fc[len(fc)-1].n = n
			continue
		}
		fc = append(fc, struct {
			at time.Time
			n  int
		}{c.at, n})
	}
	return fc
}

// none returns the windows in which no item was free.
func (fc freeCount) none() outageWindows {
	var w outageWindows
	from := time.Time{} // none free before the first item
	zero := true
	for _, c := range fc {
		switch {
		case zero && c.n > 0:
			if c.at.After(from) {
				w = append(w, [2]time.Time{from, c.at})
			}
			zero = false
		case !zero && c.n == 0:
			from, zero = c.at, true
		}
	}
	if zero && from.Before(never) {
		w = append(w, [2]time.Time{from, never})
	}
	return w
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// workerWindow is a fault's window on one worker, on the database clock.
type workerWindow struct {
	worker   int
	from, to time.Time
}

// workerFaults returns the windows of the faults aimed at one worker.
func (h *harness) workerFaults(ctx context.Context) ([]workerWindow, error) {
	rows, err := h.db.QueryContext(ctx, `SELECT target, began_at, ended_at FROM chaos_fault WHERE target LIKE 'worker-%' AND ended_at IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading faults: %w", err)
	}
	defer rows.Close()
	var ws []workerWindow
	for rows.Next() {
		var target string
		var w workerWindow
		if err := rows.Scan(&target, &w.from, &w.to); err != nil {
			return nil, err
		}
		if w.worker, err = strconv.Atoi(strings.TrimPrefix(target, "worker-")); err != nil {
			return nil, fmt.Errorf("chaos: fault target %q: %w", target, err)
		}
		ws = append(ws, w)
	}
	return ws, rows.Err()
}
