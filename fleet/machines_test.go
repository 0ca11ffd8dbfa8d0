package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// list returns a page of ListMachines or fails the test.
func list(t *testing.T, f *seeded, filter MachineFilter, after string, limit int) MachinePage {
	t.Helper()
	page, err := ListMachines(context.Background(), f.db, filter, after, limit, true)
	if err != nil {
		t.Fatalf("ListMachines(%+v, %q, %d): %v", filter, after, limit, err)
	}
	return page
}

func TestListMachinesFiltersAndPagination(t *testing.T) {
	f := seed(t)
	if page := list(t, f, MachineFilter{Process: "install-os"}, "", 50); len(page.Machines) != 1 || page.Machines[0].MachineID != f.busy || page.Next != "" {
		t.Errorf("process install-os: %+v", page)
	}
	if page := list(t, f, MachineFilter{Backoff: "install-os"}, "", 50); len(page.Machines) != 1 || page.Machines[0].MachineID != f.failed {
		t.Errorf("backoff install-os: %+v", page)
	}
	if page := list(t, f, MachineFilter{Stage: "os-installed"}, "", 50); len(page.Machines) != 1 || page.Machines[0].MachineID != f.done ||
		page.Machines[0].Stage != "os-installed" {
		t.Errorf("stage os-installed: %+v", page)
	}
	// Keyset pages cover every machine exactly once, in id order.
	for _, filter := range []MachineFilter{{}, {Stage: "new"}} {
		seen := map[uuid.UUID]bool{}
		after, pages, last := "", 0, ""
		for {
			page := list(t, f, filter, after, 50)
			pages++
			for _, m := range page.Machines {
				if seen[m.MachineID] || m.MachineID.String() <= last {
					t.Fatalf("%+v: machine %s twice or out of order", filter, m.MachineID)
				}
				seen[m.MachineID], last = true, m.MachineID.String()
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
		if want := map[string]int{"": 120, "new": 117}[filter.Stage]; len(seen) != want || pages != 3 {
			t.Errorf("%+v: %d machines on %d pages, want %d on 3", filter, len(seen), pages, want)
		}
	}
}

// Machine rows say who holds each machine since when, and why it is in
// backoff and for how long; by age, claimed machines come oldest first.
func TestListMachinesRows(t *testing.T) {
	f := seed(t)
	page := list(t, f, MachineFilter{Backoff: "install-os"}, "", 50)
	if len(page.Machines) != 1 || len(page.Machines[0].Backoffs) != 1 || page.Machines[0].Backoffs[0].Cause != "PXE timeout" ||
		page.Machines[0].Backoffs[0].SecondsLeft < 3000 || page.Machines[0].Stage != "agent-started" {
		t.Fatalf("backoff install-os: %+v", page)
	}
	page = list(t, f, MachineFilter{Process: "install-os"}, "", 50)
	if c := page.Machines[0].Claims; len(c) != 1 || !c[0].Alive || c[0].ComponentName != "os-installer" {
		t.Errorf("claims of busy: %+v", c)
	}
	// A younger claim of another process on a new machine.
	var young uuid.UUID
	if err := f.db.QueryRow("SELECT machine_id FROM machines WHERE machine_id NOT IN ($1, $2, $3) ORDER BY machine_id LIMIT 1",
		f.busy, f.failed, f.done).Scan(&young); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sess.Work(context.Background(), "provide", one(young)); err != nil {
		t.Fatal(err)
	}
	page = list(t, f, MachineFilter{Sort: SortAge}, "", 50)
	if len(page.Machines) != 2 || page.Machines[0].MachineID != f.busy || page.Machines[1].MachineID != young || page.Next != "" {
		t.Errorf("by age: %+v", page)
	}
	if page = list(t, f, MachineFilter{Sort: SortAge, Process: "provide"}, "", 50); len(page.Machines) != 1 || page.Machines[0].MachineID != young {
		t.Errorf("by age, provide: %+v", page)
	}
	// By age, a page at a time.
	first := list(t, f, MachineFilter{Sort: SortAge}, "", 1)
	if len(first.Machines) != 1 || first.Machines[0].MachineID != f.busy || first.Next == "" {
		t.Fatalf("by age, first page of 1: %+v", first)
	}
	if second := list(t, f, MachineFilter{Sort: SortAge}, first.Next, 1); len(second.Machines) != 1 || second.Machines[0].MachineID != young || second.Next != "" {
		t.Errorf("by age, second page of 1: %+v", second)
	}
}

// What ListMachines refuses: ErrInvalidArgument, the problem named.
func TestListMachinesRefuses(t *testing.T) {
	f := seed(t)
	for _, tc := range []struct {
		filter     MachineFilter
		after      string
		withStages bool
		want       string
	}{
		{MachineFilter{Sort: "size"}, "", true, `sort "size" is not one of`},
		{MachineFilter{Sort: SortAge, Backoff: "x"}, "", true, "combine it with process= only"},
		{MachineFilter{Sort: SortAge, Stage: "new"}, "", true, "combine it with process= only"},
		{MachineFilter{Sort: SortAge}, "nope_1", true, `age cursor "nope_1" is malformed`},
		{MachineFilter{Sort: SortAge}, "1_nope", true, `machine id "nope" is not a UUID`},
		{MachineFilter{}, "zzz", true, `after: machine id "zzz" is not a UUID`},
		{MachineFilter{Stage: "new"}, "", false, "defines no stages"},
	} {
		_, err := ListMachines(context.Background(), f.db, tc.filter, tc.after, 10, tc.withStages)
		var fe *Error
		if !errors.Is(err, ErrInvalidArgument) || !errors.As(err, &fe) || !strings.Contains(fe.Msg, tc.want) || err.Error() != fe.Msg {
			t.Errorf("ListMachines(%+v, %q) = %v; want ErrInvalidArgument with %q", tc.filter, tc.after, err, tc.want)
		}
	}
}
