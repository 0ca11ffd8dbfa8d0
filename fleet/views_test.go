package fleet

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/migrations"
)

// An application with stages of its own: its stages, in its order, with
// its descriptions, and its machines' stages.
func TestCustomStages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app := &migrations.Application{Name: "racks", Migrations: fstest.MapFS{
		"000001_racks.up.sql": {Data: []byte(`
CREATE TABLE racked (machine_id UUID PRIMARY KEY REFERENCES machines);
CREATE VIEW app_stages AS
SELECT 'unracked'::TEXT AS stage, 1::INT8 AS position, 'waiting for a rack'::TEXT AS description
UNION ALL SELECT 'racked', 2, 'in its rack';
CREATE VIEW app_machine_stages AS
SELECT m.machine_id, CASE WHEN r.machine_id IS NULL THEN 'unracked' ELSE 'racked' END AS stage
FROM machines m LEFT JOIN racked r ON r.machine_id = m.machine_id;`)},
		"000001_racks.down.sql": {Data: []byte("DROP VIEW app_machine_stages; DROP VIEW app_stages; DROP TABLE racked;")},
	}}
	conn, sess := open(t, "racker", app)
	db := conn.DB()
	ids := machines(t, sess, 3)
	if err := sess.Transact(ctx, func(tx *bmdb.Tx) error {
		_, err := tx.DBTX().ExecContext(ctx, "INSERT INTO racked VALUES ($1)", ids[0])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	views, err := ReadAppViews(ctx, db)
	if err != nil || views != (AppViews{Stages: true}) {
		t.Errorf("views %+v, %v", views, err)
	}
	stages, err := ReadStages(ctx, db)
	if err != nil || len(stages) != 2 || stages[0].Name != "unracked" || stages[0].Machines != 2 || stages[1].Name != "racked" ||
		stages[1].Machines != 1 || stages[1].Description != "in its rack" || stages[1].Position != 2 {
		t.Errorf("stages %+v, %v", stages, err)
	}
	byID, err := ReadMachineStages(ctx, db, ids)
	if err != nil || len(byID) != 3 || byID[ids[0]] != "racked" || byID[ids[1]] != "unracked" {
		t.Errorf("machine stages %v, %v", byID, err)
	}
	page, err := ListMachines(ctx, db, MachineFilter{Stage: "racked"}, "", 10, true)
	if err != nil || len(page.Machines) != 1 || page.Machines[0].MachineID != ids[0] || page.Machines[0].Stage != "racked" {
		t.Errorf("stage racked: %+v, %v", page, err)
	}
}

// Without an application's stages, bmdb's generic views: no stages, no
// tags, machines without a stage.
func TestNoStages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, sess := open(t, "plain", nil)
	db := conn.DB()
	ids := machines(t, sess, 2)
	if _, err := sess.Work(ctx, "burn-in", one(ids[0])); err != nil {
		t.Fatal(err)
	}
	if views, err := ReadAppViews(ctx, db); err != nil || views != (AppViews{}) {
		t.Errorf("views %+v, %v", views, err)
	}
	if stages, err := ReadStages(ctx, db); err != nil || stages != nil {
		t.Errorf("stages %+v, %v; want nil", stages, err)
	}
	o := overview(t, db)
	if o.Stages != nil || o.Machines != 2 || health(t, o, "burn-in").LiveClaims != 1 {
		t.Errorf("overview %+v", o)
	}
	page, err := ListMachines(ctx, db, MachineFilter{Process: "burn-in"}, "", 10, false)
	if err != nil || len(page.Machines) != 1 || page.Machines[0].MachineID != ids[0] || page.Machines[0].LiveClaims != 1 || page.Machines[0].Stage != "" {
		t.Errorf("process burn-in: %+v, %v", page, err)
	}
	m, err := ReadMachine(ctx, db, ids[0], "", 10)
	if err != nil || m.Status.Stage != "" || m.Tags != nil || len(m.Work) != 1 {
		t.Errorf("machine %+v, %v", m, err)
	}
}
