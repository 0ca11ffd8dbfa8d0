package fleet

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// A process's controls as the overview and bmdbctl show them, and their
// history, newest first.
func TestProcessControls(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	if _, err := f.sess.PauseProcess(ctx, "install-os", bmdb.ControlChange{By: "alice", Reason: "bad image"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sess.CapProcess(ctx, "install-os", 3, bmdb.ControlChange{By: "bob"}); err != nil {
		t.Fatal(err)
	}
	all, err := ReadProcessControls(ctx, f.db)
	if err != nil || len(all) != 1 || !all[0].Paused || all[0].ClaimCap == nil || *all[0].ClaimCap != 3 || all[0].ChangedBy != "bob" || all[0].LiveClaims != 1 {
		t.Errorf("controls: %+v, %v", all, err)
	}
	history, err := ReadControlHistory(ctx, f.db, "install-os", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range history {
		got = append(got, r.Action+":"+capCellOf(r.ClaimCap)+":"+r.Actor+":"+r.Reason)
	}
	if want := "cap:3:bob:|pause:-:alice:bad image"; strings.Join(got, "|") != want {
		t.Errorf("history, newest first = %q, want %q", strings.Join(got, "|"), want)
	}
	if h, err := ReadControlHistory(ctx, f.db, "", 1); err != nil || len(h) != 1 || h[0].Action != "cap" {
		t.Errorf("history of every process, limit 1: %+v, %v", h, err)
	}
}

func capCellOf(c *int64) string {
	if c == nil {
		return "-"
	}
	return strconv.FormatInt(*c, 10)
}
