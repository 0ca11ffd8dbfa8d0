package fleet

import (
	"context"
	"testing"
)

// The overview counts the machines per stage of the application's, lists
// the live sessions and the last hour's failures.
func TestReadOverview(t *testing.T) {
	f := seed(t)
	o := overview(t, f.db)
	want := map[string]int64{"new": 117, "provided": 0, "agent-started": 2, "os-installed": 1}
	if len(o.Stages) != len(want) {
		t.Errorf("stages %+v, want %v", o.Stages, want)
	}
	for _, s := range o.Stages {
		if want[s.Name] != s.Machines {
			t.Errorf("stage %s: %d machines, want %d", s.Name, s.Machines, want[s.Name])
		}
	}
	if o.Machines != 120 || len(o.Sessions) != 1 || len(o.Failures) != 1 || o.Failures[0].MachineID != f.failed || o.Now.IsZero() {
		t.Errorf("overview = %+v", o)
	}
	if len(o.Controls) != 1 || o.Controls[0].Process != "install-os" || o.Controls[0].LiveClaims != 1 || o.Paused() != nil {
		t.Errorf("controls %+v, paused %+v", o.Controls, o.Paused())
	}
}

// While its worker lives, install-os has a live claim, a machine in
// backoff and no warning; provide has 117 machines pending
// (app_pending_work) and nobody who ever did it.
func TestHealth(t *testing.T) {
	f := seed(t)
	o := overview(t, f.db)
	p := health(t, o, "install-os")
	if p.LiveClaims != 1 || p.ExpiredClaims != 0 || p.InBackoff != 1 || p.Pending != 1 || p.LiveSessions != 1 ||
		p.Warning != "" || len(p.Components) != 1 || p.Components[0] != "os-installer" {
		t.Errorf("install-os health %+v", p)
	}
	if p := health(t, o, "provide"); p.Ready != 117 || p.Pending != 117 || p.Warning != "117 machines wait for provide and no component has done it recently" {
		t.Errorf("provide health %+v", p)
	}
	if w := o.Warnings(); len(w) != 1 || w[0] != health(t, o, "provide").Warning {
		t.Errorf("warnings %q", w)
	}
	if len(o.Stuck) != 0 || len(o.ExpiredSessions) != 0 {
		t.Errorf("stuck %v, expired sessions %v", o.Stuck, o.ExpiredSessions)
	}
}

// A frozen worker: its session expires with a claim. The claim is stuck,
// and install-os has machines waiting and no live session.
func TestStuckHealth(t *testing.T) {
	f := seed(t)
	f.expire(t)
	o := overview(t, f.db)
	p := health(t, o, "install-os")
	if p.LiveClaims != 0 || p.ExpiredClaims != 1 || p.OldestExpiredAgeSeconds <= 0 || p.InBackoff != 1 || p.Pending != 2 ||
		p.LiveSessions != 0 || p.Warning != "2 machines wait for install-os and no live session of os-installer" {
		t.Errorf("install-os health %+v", p)
	}
	if len(o.Stuck) != 1 || o.Stuck[0].MachineID != f.busy || o.Stuck[0].Alive || len(o.Sessions) != 0 ||
		len(o.ExpiredSessions) != 1 || o.ExpiredSessions[0].SessionID != f.sess.ID() {
		t.Errorf("stuck %+v, live sessions %d, expired sessions %+v", o.Stuck, len(o.Sessions), o.ExpiredSessions)
	}
}

// A fleet without live sessions: a process nothing waits for has no
// warning; one a machine waits for (memtest, whose backoff is over) has.
func TestIdleHealth(t *testing.T) {
	h := seedIdle(t)
	o := overview(t, h.db)
	if hp := health(t, o, "burn-in"); hp.LiveSessions != 0 || hp.Pending != 0 || hp.Warning != "" {
		t.Errorf("burn-in, nothing waiting: %+v", hp)
	}
	if hp := health(t, o, "memtest"); hp.LiveSessions != 0 || hp.Pending != 1 || hp.BackoffDue != 1 || hp.Warning == "" {
		t.Errorf("memtest, one machine waiting: %+v", hp)
	}
}

// A cancelled read returns its error, not a partial overview.
func TestReadOverviewCancelled(t *testing.T) {
	f := seed(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if o, err := ReadOverview(ctx, f.db); err == nil || o.Machines != 0 {
		t.Errorf("ReadOverview with a cancelled context = %+v, %v; want an error", o, err)
	}
}
