package fleet

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// A process's controls as the overview and bmdbctl show them, and their
// history, a deletion included.
func TestProcessControls(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	ch := bmdb.ControlChange{By: "alice", Reason: "bad image"}
	c, ok, err := ReadProcessControl(ctx, f.db, "install-os")
	if err != nil || !ok || c.InForce() || c.State() != "running without a cap" || c.LiveClaims != 1 {
		t.Fatalf("install-os before: %+v, %v, %v", c, ok, err)
	}
	if _, err := f.sess.PauseProcess(ctx, "install-os", ch); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sess.CapProcess(ctx, "install-os", 3, bmdb.ControlChange{By: "bob"}); err != nil {
		t.Fatal(err)
	}
	c, ok, err = ReadProcessControl(ctx, f.db, "install-os")
	if err != nil || !ok || !c.InForce() || c.State() != "paused and capped at 3 live claims" || c.ChangedBy != "bob" {
		t.Errorf("install-os paused and capped: %+v (%s), %v, %v", c, c.State(), ok, err)
	}
	if _, ok, err := ReadProcessControl(ctx, f.db, "provide"); ok || err != nil {
		t.Errorf("provide, which never claimed: controls %v, %v; want none", ok, err)
	}
	if _, err := f.sess.DeleteProcessControls(ctx, "install-os", bmdb.ControlChange{By: "carol", Reason: "retired"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadProcessControl(ctx, f.db, "install-os"); ok || err != nil {
		t.Errorf("install-os deleted: controls %v, %v; want none", ok, err)
	}
	all, err := ReadProcessControls(ctx, f.db)
	if err != nil || len(all) != 0 {
		t.Errorf("controls after the deletion: %+v, %v", all, err)
	}
	history, err := ReadControlHistory(ctx, f.db, "install-os", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range history {
		got = append(got, r.Action+":"+capCellOf(r.ClaimCap)+":"+r.Actor+":"+r.Reason)
	}
	if want := "delete:3:carol:retired|cap:3:bob:|pause:-:alice:bad image"; strings.Join(got, "|") != want {
		t.Errorf("history, newest first = %q, want %q", strings.Join(got, "|"), want)
	}
	if h, err := ReadControlHistory(ctx, f.db, "", 1); err != nil || len(h) != 1 || h[0].Action != "delete" {
		t.Errorf("history of every process, limit 1: %+v, %v", h, err)
	}
}

func capCellOf(c *int64) string {
	if c == nil {
		return "-"
	}
	return strconv.FormatInt(*c, 10)
}
