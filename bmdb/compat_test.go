package bmdb

import (
	"context"
	"testing"

	"github.com/bmdb-dev/bmdb/model"
)

// Statements of binaries built for migration 000002, verbatim: the history
// writes without component_name. Migrations 000003-000005 promise they keep
// working.
const (
	v2WorkStart = `WITH claim AS (
    INSERT INTO work (machine_id, process, session_id)
    VALUES ($1, $2, $3)
    RETURNING machine_id, process, session_id, started_at
)
INSERT INTO work_history (machine_id, process, session_id, event, at)
SELECT claim.machine_id, claim.process, claim.session_id, 'Started', claim.started_at
FROM claim`
	v2WorkEnd = `WITH ended AS (
    DELETE FROM work
    WHERE work.machine_id = $3 AND work.process = $4
      AND work.session_id = $5
    RETURNING work.machine_id, work.process, work.session_id
)
INSERT INTO work_history (machine_id, process, session_id, event, failed_cause)
SELECT ended.machine_id, ended.process, ended.session_id,
       $1::work_history_event, $2::TEXT
FROM ended`
	v2WorkHistoryForMachine = `SELECT id, machine_id, process, session_id, event, at, failed_cause FROM work_history
WHERE machine_id = $1
ORDER BY at, id`
)

// Rolling upgrade: a binary of the previous schema version, still running
// while 000003-000005 are applied, keeps claiming and finishing, and the new views
// show its history with the component taken from its session.
func TestPreviousBinaryOnNewSchema(t *testing.T) {
	e := newEnv(t) // migrated to the newest version
	s := e.session(e.open(func(c *Config) { c.ComponentName = "old-binary" }))
	m := e.machine()
	ctx := context.Background()
	if _, err := e.db.ExecContext(ctx, v2WorkStart, m, "install", s.ID()); err != nil {
		t.Fatalf("previous WorkStart: %v", err)
	}
	res, err := e.db.ExecContext(ctx, v2WorkEnd, "Finished", nil, m, "install", s.ID())
	if err != nil {
		t.Fatalf("previous WorkEnd: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("previous WorkEnd affected %d rows", n)
	}
	rows, err := e.db.QueryContext(ctx, v2WorkHistoryForMachine, m)
	if err != nil {
		t.Fatalf("previous WorkHistoryForMachine: %v", err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if n != 2 {
		t.Errorf("previous history query saw %d rows, want 2", n)
	}
	history, err := e.q.ReadableHistoryForMachine(ctx, model.ReadableHistoryForMachineParams{MachineID: m, RowLimit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range history {
		if h.ComponentName != "old-binary" {
			t.Errorf("readable_history of an old binary's %s: component %q, want it from the session", h.Event, h.ComponentName)
		}
	}
}
