package bmdbtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/model"
)

// The Require functions read bmdb's tables through db (a Connection's
// DB(), a *sql.DB or a *sql.Tx) as they are when called: call them once
// the loops have returned (RunUntilIdle) or the sessions are closed. Each
// checks one process on the machines given, at least one. It reports the
// machines that fail the check in one t.Errorf (up to maxReported of
// them, each with what bmdb records of it, then how many more), so that
// the test goes on and sees everything that is wrong; it fails t with
// t.Fatalf if it cannot read the database. They must be called from the
// test's goroutine.

// RequireFinishedOnce checks that each machine was finished exactly once
// for process (one Finished event in work_history: no machine processed
// twice, none left out) and is not claimed for it now.
func RequireFinishedOnce(t testing.TB, db model.DBTX, process string, machines ...uuid.UUID) {
	t.Helper()
	require(t, db, process, machines, "finished exactly once and not claimed", func(f facts) bool {
		return f.events[model.WorkHistoryEventFinished] == 1 && !f.claimed
	})
}

// RequireInBackoff checks that each machine is in backoff for process now
// (its last claim failed, and the backoff has not ended: bmdb refuses to
// claim it until then) and is not claimed for it.
func RequireInBackoff(t testing.TB, db model.DBTX, process string, machines ...uuid.UUID) {
	t.Helper()
	require(t, db, process, machines, "in backoff and not claimed", func(f facts) bool {
		return f.inBackoff && !f.claimed
	})
}

// RequireAbandoned checks that a claim of each machine for process was
// abandoned at least once (an Abandoned event in work_history): its
// session expired, and another session took the claim over or garbage
// collection deleted it.
func RequireAbandoned(t testing.TB, db model.DBTX, process string, machines ...uuid.UUID) {
	t.Helper()
	require(t, db, process, machines, "abandoned at least once", func(f facts) bool {
		return f.events[model.WorkHistoryEventAbandoned] > 0
	})
}

// maxReported bounds the machines a Require function lists.
const maxReported = 10

// facts is what bmdb records of one machine and process.
type facts struct {
	events    map[model.WorkHistoryEvent]int64
	claimed   bool // held by a session, alive or expired
	inBackoff bool // a backoff in force
}

// eventOrder is the order in which facts lists events.
var eventOrder = []model.WorkHistoryEvent{
	model.WorkHistoryEventStarted, model.WorkHistoryEventFinished, model.WorkHistoryEventFailed,
	model.WorkHistoryEventCanceled, model.WorkHistoryEventAbandoned, model.WorkHistoryEventBackoffCleared,
}

func (f facts) String() string {
	var parts []string
	for _, e := range eventOrder {
		if n := f.events[e]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", e, n))
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "no history")
	}
	if f.claimed {
		parts = append(parts, "claimed now")
	}
	if f.inBackoff {
		parts = append(parts, "in backoff now")
	}
	return strings.Join(parts, ", ")
}

// require reports, in one t.Errorf, the machines whose facts fail ok.
func require(t testing.TB, db model.DBTX, process string, machines []uuid.UUID, want string, ok func(facts) bool) {
	t.Helper()
	all := read(t, db, process, machines)
	var bad []string
	for _, m := range machines {
		if f := all[m]; !ok(*f) {
			bad = append(bad, fmt.Sprintf("%s (%s)", m, f))
		}
	}
	if len(bad) == 0 {
		return
	}
	n, more := len(bad), ""
	if n > maxReported {
		bad, more = bad[:maxReported], fmt.Sprintf("; and %d more", n-maxReported)
	}
	t.Errorf("bmdbtest: %d of %d machines are not %s for process %q: %s%s",
		n, len(machines), want, process, strings.Join(bad, "; "), more)
}

// read returns what bmdb records of each machine for process.
func read(t testing.TB, db model.DBTX, process string, machines []uuid.UUID) map[uuid.UUID]*facts {
	t.Helper()
	if len(machines) == 0 {
		t.Fatal("bmdbtest: no machines given")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := map[uuid.UUID]*facts{}
	for _, m := range machines {
		out[m] = &facts{events: map[model.WorkHistoryEvent]int64{}}
	}
	q := model.New(db)
	counts, err := q.WorkHistoryEventCountsForMachines(ctx, model.WorkHistoryEventCountsForMachinesParams{Process: process, MachineIds: machines})
	if err != nil {
		t.Fatalf("bmdbtest: reading work_history: %v", err)
	}
	for _, c := range counts {
		out[c.MachineID].events[c.Event] = c.Events
	}
	claims, err := q.CurrentWorkForMachines(ctx, machines)
	if err != nil {
		t.Fatalf("bmdbtest: reading the claims: %v", err)
	}
	for _, c := range claims {
		if c.Process == process {
			out[c.MachineID].claimed = true
		}
	}
	backoffs, err := q.ActiveBackoffsForMachines(ctx, machines)
	if err != nil {
		t.Fatalf("bmdbtest: reading the backoffs: %v", err)
	}
	for _, b := range backoffs {
		if b.Process == process {
			out[b.MachineID].inBackoff = true
		}
	}
	return out
}
