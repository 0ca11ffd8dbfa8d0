package web

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// history is a fleet after a takeover, a GC of the rest of an expired
// session's claims, and a backoff that is over, with every session gone:
// an idle fleet.
type history struct {
	*site
	takenOver, collected, backedOff uuid.UUID
	taker                           uuid.UUID // the session that took over
}

func seedHistory(t *testing.T) *history {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	dsn := testdb.New(t)
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "burner", SessionInterval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	db := conn.DB()
	frozen, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	if err := frozen.Transact(ctx, func(tx *bmdb.Tx) error {
		ids, err = tx.CreateMachines(ctx, 3)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	h := &history{takenOver: ids[0], collected: ids[1], backedOff: ids[2]}
	one := func(id uuid.UUID) func(*bmdb.Tx) ([]uuid.UUID, error) {
		return func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{id}, nil }
	}
	for _, m := range ids[:2] {
		if _, err := frozen.Work(ctx, "burn-in", one(m)); err != nil {
			t.Fatal(err)
		}
	}
	// The frozen worker's session expires on the database clock; another
	// takes one of its claims over, which abandons both.
	if _, err := db.Exec("UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1", frozen.ID()); err != nil {
		t.Fatal(err)
	}
	taker, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.taker = taker.ID()
	w, err := taker.Work(ctx, "burn-in", one(h.takenOver))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(ctx, func(*bmdb.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A failure whose backoff is over by now (on the database clock).
	w, err = taker.Work(ctx, "memtest", one(h.backedOff))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Fail(ctx, &bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2}, "ECC errors"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE work_backoff SET until = now() - interval '1 minute' WHERE machine_id = $1", h.backedOff); err != nil {
		t.Fatal(err)
	}
	if err := taker.Close(ctx); err != nil {
		t.Fatal(err)
	}
	frozen.Close(ctx) // its row is gone already (taken over)
	h.site = &site{db: db, srv: httptest.NewServer(New(db, Options{}))}
	t.Cleanup(h.srv.Close)
	return h
}

// An Abandoned row says why, on the machine page: taken over by another
// session, or removed with the expired session (fleet.ReadMachine's
// AbandonedWhy).
func TestAbandonedSaysWhy(t *testing.T) {
	h := seedHistory(t)
	_, body := h.get(t, "/machine/"+h.takenOver.String())
	mustContain(t, "taken-over machine page", body, "its holder&#39;s session had expired; taken over by session "+h.taker.String()[:8]+" (burner)")
	_, body = h.get(t, "/machine/"+h.collected.String())
	mustContain(t, "collected machine page", body, "had expired; removed when the expired session was collected (GC) or closed")
}

// A backoff that is over is history: listed under "Past backoffs", not
// among the backoffs in force.
func TestPastBackoffsAreHistory(t *testing.T) {
	h := seedHistory(t)
	_, body := h.get(t, "/machine/"+h.backedOff.String())
	inForce, _, _ := strings.Cut(body[strings.Index(body, `id="backoffs"`):], "</table>")
	if strings.Contains(inForce, "ECC errors") || !strings.Contains(inForce, "none") {
		t.Errorf("an expired backoff is shown as in force:\n%s", inForce)
	}
	i := strings.Index(body, `id="past-backoffs"`)
	if i < 0 {
		t.Fatalf("no past backoffs on the machine page:\n%s", body)
	}
	mustContain(t, "past backoffs", body[i:], "memtest", "ECC errors", "1.0h")
}

// A fleet without live sessions. The overview's "live sessions" 0 is not
// painted red for a process nothing waits for (burn-in), only for one a
// machine waits for (memtest, whose backoff is over).
func TestIdleOverviewIsNotRed(t *testing.T) {
	h := seedHistory(t)
	_, body := h.get(t, "/")
	rows := map[string]string{}
	for _, p := range []string{"burn-in", "memtest"} {
		i := strings.Index(body, "<td>"+p+"</td>")
		if i < 0 {
			t.Fatalf("no row for %s in the overview:\n%s", p, body)
		}
		rows[p], _, _ = strings.Cut(body[i:], "</tr>")
	}
	if strings.Contains(rows["burn-in"], `class="bad"`) || !strings.Contains(rows["burn-in"], `<span class="muted" title="nothing waits for this process">0</span>`) {
		t.Errorf("burn-in's row, nothing waiting, is red or lacks a muted 0:\n%s", rows["burn-in"])
	}
	if !strings.Contains(rows["memtest"], `<span class="bad" title="machines wait for this process and no live session does it">0</span>`) {
		t.Errorf("memtest's row, a machine waiting, lacks a red 0:\n%s", rows["memtest"])
	}
}
