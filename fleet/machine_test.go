package fleet

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// A machine with its stage, tags, claims and backoffs, and its history by
// keyset pages, newest first.
func TestReadMachine(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	m, err := ReadMachine(ctx, f.db, f.busy, "", 50)
	if err != nil {
		t.Fatal(err)
	}
	if m.Status.Stage != "agent-started" || m.Status.LiveClaims != 1 || len(m.Work) != 1 || m.Work[0].SessionID != f.sess.ID() ||
		len(m.Tags) != 2 || len(m.History) != 1 || m.History[0].Event != "Started" || m.Now.IsZero() {
		t.Errorf("busy machine %+v", m)
	}
	m, err = ReadMachine(ctx, f.db, f.failed, "", 50)
	if err != nil {
		t.Fatal(err)
	}
	if a := m.ActiveBackoffs(); len(a) != 1 || a[0].Cause != "PXE timeout" || len(m.PastBackoffs()) != 0 {
		t.Errorf("failed machine: backoffs in force %+v, past %+v", a, m.PastBackoffs())
	}

	m, err = ReadMachine(ctx, f.db, f.done, "", 50)
	if err != nil {
		t.Fatal(err)
	}
	if m.Status.Stage != "os-installed" || len(m.Tags) != 3 || len(m.History) != 50 || m.Older == "" || m.History[0].Event != "Finished" {
		t.Fatalf("done machine: stage %s, %d tags, %d events, older %q", m.Status.Stage, len(m.Tags), len(m.History), m.Older)
	}
	seen := map[int64]bool{}
	for {
		for _, h := range m.History {
			if seen[h.ID] {
				t.Fatalf("event %d on two pages", h.ID)
			}
			seen[h.ID] = true
		}
		if m.Older == "" {
			break
		}
		if m, err = ReadMachine(ctx, f.db, f.done, m.Older, 50); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 120 {
		t.Errorf("%d history events over all pages, want 120", len(seen))
	}
}

// An unknown machine is ErrNotFound, a malformed cursor
// ErrInvalidArgument (even for an unknown machine).
func TestReadMachineRefuses(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	unknown := uuid.New()
	if _, err := ReadMachine(ctx, f.db, unknown, "", 50); !errors.Is(err, ErrNotFound) || err.Error() != "no machine "+unknown.String() {
		t.Errorf("ReadMachine of an unknown machine = %v, want ErrNotFound", err)
	}
	if _, err := ReadMachineStatus(ctx, f.db, unknown); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadMachineStatus of an unknown machine = %v, want ErrNotFound", err)
	}
	for _, cursor := range []string{"nope", "1_x", "x_1", "12"} {
		if _, err := ReadMachine(ctx, f.db, unknown, cursor, 50); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "history cursor") {
			t.Errorf("ReadMachine before %q = %v, want ErrInvalidArgument", cursor, err)
		}
	}
}

// ReadMachineStatus is the status ReadMachine has.
func TestReadMachineStatus(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	s, err := ReadMachineStatus(ctx, f.db, f.failed)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ReadMachine(ctx, f.db, f.failed, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.Stage != "agent-started" || s.ActiveBackoffs != 1 || s.MachineID != m.Status.MachineID || s.Stage != m.Status.Stage ||
		s.ActiveBackoffs != m.Status.ActiveBackoffs {
		t.Errorf("status %+v, machine's %+v", s, m.Status)
	}
}

// An Abandoned event says why: the holder's session had expired, and the
// claim was taken over by another session, or removed with the expired
// session. A backoff that is over is past, not in force.
func TestAbandonedWhy(t *testing.T) {
	h := seedIdle(t)
	ctx := context.Background()
	m, err := ReadMachine(ctx, h.db, h.takenOver, "", 50)
	if err != nil {
		t.Fatal(err)
	}
	why := ""
	for _, e := range m.History {
		if e.Event == "Abandoned" {
			why = m.AbandonedWhy[e.ID]
		}
	}
	if want := "its holder's session had expired; taken over by session " + h.taker.String()[:8] + " (burner)"; why != want {
		t.Errorf("taken-over machine: Abandoned why %q, want %q (history %+v)", why, want, m.History)
	}
	if m, err = ReadMachine(ctx, h.db, h.collected, "", 50); err != nil {
		t.Fatal(err)
	}
	if len(m.AbandonedWhy) != 1 {
		t.Fatalf("collected machine: abandoned_why %v", m.AbandonedWhy)
	}
	for _, why := range m.AbandonedWhy {
		if !strings.Contains(why, "had expired; removed when the expired session was collected (GC) or closed") {
			t.Errorf("collected machine: Abandoned why %q", why)
		}
	}
	if m, err = ReadMachine(ctx, h.db, h.backedOff, "", 50); err != nil {
		t.Fatal(err)
	}
	if p := m.PastBackoffs(); len(m.ActiveBackoffs()) != 0 || len(p) != 1 || p[0].Cause != "ECC errors" {
		t.Errorf("backed-off machine: in force %+v, past %+v", m.ActiveBackoffs(), p)
	}
}

// A machine's history pages come by process, each newest first in the
// order its events happened (seq), whatever their dates: on CockroachDB
// each gateway dates rows by its own clock. Here every second row is dated
// a second before the row before it.
func TestMachineHistoryInTheOrderItHappened(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	m := uuid.New()
	if _, err := f.db.Exec(`INSERT INTO machines (machine_id) VALUES ($1)`, m); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(`INSERT INTO work_history (machine_id, process, session_id, event, at, seq)
		SELECT $1, p, gen_random_uuid(), (CASE WHEN i % 2 = 1 THEN 'Started' ELSE 'Finished' END)::work_history_event,
		       now() - INTERVAL '1 hour' + i * INTERVAL '1 second' - (i % 2) * INTERVAL '1500 milliseconds', i
		FROM generate_series(1, 30) AS i, unnest(ARRAY['a', 'b']) AS p`, m); err != nil {
		t.Fatal(err)
	}
	var got []string
	cursor := ""
	for {
		page, err := ReadMachine(ctx, f.db, m, cursor, 7)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range page.History {
			got = append(got, h.Process+":"+strconv.FormatInt(h.Seq.Int64, 10))
		}
		if cursor = page.Older; cursor == "" {
			break
		}
	}
	var want []string
	for _, p := range []string{"a", "b"} {
		for i := 30; i >= 1; i-- {
			want = append(want, p+":"+strconv.Itoa(i))
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("pages = %v\nwant %v", got, want)
	}
}
