package crdbmode

import (
	"slices"
	"testing"
	"time"
)

// The lock models of statements of the shapes bmdb and applications use.
func TestLockModels(t *testing.T) {
	for _, tc := range []struct {
		name, query string
		want        []lockModel
	}{
		{"point lookup, filter after the fetch",
			"-- name: X :one\nSELECT session_id FROM sessions\nWHERE session_id = $1 AND deadline <= statement_timestamp()\nFOR NO KEY UPDATE SKIP LOCKED",
			[]lockModel{{"SELECT 1 FROM sessions sessions WHERE session_id = $1 FOR NO KEY UPDATE SKIP LOCKED", []int{0}}}},
		{"a CTE's locking read over an IN list, limited",
			"WITH a AS (SELECT 1), locked AS (\n SELECT f.machine_id FROM work_fencing f\n WHERE f.process = $3::TEXT AND f.machine_id = ANY ($5::UUID[])\n  AND NOT f.claimed AND EXISTS (SELECT 1 FROM a)\n ORDER BY f.machine_id LIMIT $4::INT8\n FOR UPDATE SKIP LOCKED\n) SELECT * FROM locked",
			[]lockModel{{"SELECT 1 FROM work_fencing f WHERE f.process = $1 AND f.machine_id = ANY ($2) FOR UPDATE SKIP LOCKED", []int{2, 4}}}},
		{"OF one of two tables, a filter joining the other",
			"WITH slots AS (SELECT s.slot FROM process_slots s, open o\n WHERE s.process = $3::TEXT AND s.slot < o.claim_cap\n ORDER BY s.slot LIMIT $4 FOR UPDATE OF s SKIP LOCKED) SELECT 1",
			[]lockModel{{"SELECT 1 FROM process_slots s WHERE s.process = $1 FOR UPDATE SKIP LOCKED", []int{2}}}},
		{"no constraining predicate: not modelled",
			"SELECT f.machine_id FROM work_fencing f JOIN picks p ON p.machine_id = f.machine_id FOR UPDATE OF f", nil},
		{"shared locks are no locks", "SELECT 1 FROM sessions WHERE session_id = $1 FOR KEY SHARE", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := lockModels(tc.query)
			if !slices.EqualFunc(got, tc.want, func(a, b lockModel) bool { return a.query == b.query && slices.Equal(a.args, b.args) }) {
				t.Errorf("lockModels =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestSharedLocksAndClock(t *testing.T) {
	q := "SELECT a FROM t WHERE x = $1 FOR KEY SHARE), c AS (SELECT 1 FROM u FOR SHARE OF u SKIP LOCKED) SELECT now(), clock_timestamp()"
	want := "SELECT a FROM t WHERE x = $1), c AS (SELECT 1 FROM u) SELECT (now() + INTERVAL '-250000 microseconds'), (clock_timestamp() + INTERVAL '-250000 microseconds')"
	if got := skewedClock(sharedLocks(q), -250*time.Millisecond); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
