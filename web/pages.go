package web

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/fleet"
)

// Page sizes.
const (
	machinesPerPage = 50
	historyPerPage  = 50
)

// The pages' data are package fleet's read model (fleet.Overview,
// fleet.Machine, fleet.Session), and for /machines a list with its
// filter.

func (h *Handler) overview(ctx context.Context, _ *http.Request) (any, error) {
	return fleet.ReadOverview(ctx, h.db)
}

// Machines is the data of the /machines page.
type Machines struct {
	// Now is the database's clock when the page was read.
	Now    time.Time           `json:"now"`
	Filter fleet.MachineFilter `json:"filter"`
	// Stages names the application's stages, for the filter links; empty
	// when it defines none.
	Stages   []string           `json:"stages"`
	Machines []fleet.MachineRow `json:"machines"`
	// Next is the after= cursor of the next page, empty on the last.
	Next string `json:"next,omitempty"`
}

func (h *Handler) machines(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	f := fleet.MachineFilter{Stage: q.Get("stage"), Process: q.Get("process"), Backoff: q.Get("backoff"), Sort: q.Get("sort")}
	stages, err := fleet.ReadStages(ctx, h.db)
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, s := range stages {
		names = append(names, s.Name)
	}
	if f.Stage != "" && stages != nil && !slices.Contains(names, f.Stage) {
		return nil, badRequest("stage %q is not one of %s", f.Stage, strings.Join(names, ", "))
	}
	for _, p := range []string{f.Process, f.Backoff} {
		if p == "" {
			continue
		}
		if err := bmdb.ValidateProcess(p); err != nil {
			return nil, badRequest("process %q: %v", p, err)
		}
	}
	now, err := fleet.Now(ctx, h.db)
	if err != nil {
		return nil, err
	}
	page, err := fleet.ListMachines(ctx, h.db, f, q.Get("after"), machinesPerPage, stages != nil)
	if err != nil {
		return nil, err
	}
	return Machines{Now: now, Filter: f, Stages: names, Machines: page.Machines, Next: page.Next}, nil
}

func (h *Handler) machine(ctx context.Context, r *http.Request) (any, error) {
	id, err := parseID("machine", r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return fleet.ReadMachine(ctx, h.db, id, r.URL.Query().Get("before"), historyPerPage)
}

func (h *Handler) session(ctx context.Context, r *http.Request) (any, error) {
	id, err := parseID("session", r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return fleet.ReadSession(ctx, h.db, id, historyPerPage)
}
