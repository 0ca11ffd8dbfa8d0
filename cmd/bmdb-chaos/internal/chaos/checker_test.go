package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// checkLogOf runs checkLog over log and returns its violations.
func checkLogOf(t *testing.T, log string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "worker-0.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &Report{}
	(&harness{}).checkLog(r, &proc{logPath: path})
	return r.Violations
}

func TestCheckLog(t *testing.T) {
	const (
		claimed = "I1202 14:13:53.9 1 worker.go:70] chaos: claimed M1 session S1\n"
		stop    = "chaos-harness: 14:13:54.066429 SIGSTOP for 2.695s\n"
		cont    = "chaos-harness: 14:13:56.763035 SIGCONT\n"
		done    = "I1202 14:13:56.7 1 worker.go:79] chaos: done M1 session S1\n"
		lost    = "W1202 14:13:56.7 1 worker.go:331] worker chaos: claim of M1 lost: bmdb: session expired\n"
		ended   = "W1202 14:13:56.7 1 session.go:242] bmdb: session S1 of \"chaos-w0\" ended: bmdb: session expired\n"
	)
	for _, tc := range []struct {
		name, log string
		want      []string // substrings of the violations, in order
	}{
		{"stall reported", claimed + stop + cont + done + lost + ended, nil},
		{"stall not reported", claimed + stop + cont + done, []string{"M1 was mid-work", "no session end"}},
		{"lost before the stall does not count", claimed + lost + stop + cont + ended, nil},
		{"partition without session end", "chaos-harness: 14:14:15.2 partition cut (reset) for 2s\n", []string{"no session end"}},
		{"race report", "WARNING: DATA RACE\n", []string{"DATA RACE"}},
	} {
		got := checkLogOf(t, tc.log)
		if len(got) != len(tc.want) {
			t.Errorf("%s: violations %q, want %d", tc.name, got, len(tc.want))
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], tc.want[i]) {
				t.Errorf("%s: violation %q does not mention %q", tc.name, got[i], tc.want[i])
			}
		}
	}
}

func TestOverlapAndQuantile(t *testing.T) {
	t0 := time.Unix(1000, 0)
	o := outageWindows{{t0.Add(time.Second), t0.Add(3 * time.Second)}}
	if got := o.overlap(t0, t0.Add(2*time.Second)); got != time.Second {
		t.Errorf("overlap = %v, want 1s", got)
	}
	if got := o.overlap(t0.Add(4*time.Second), t0.Add(5*time.Second)); got != 0 {
		t.Errorf("disjoint overlap = %v, want 0", got)
	}
	ds := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if q := quantile(ds, 0.99); q != 10 {
		t.Errorf("p99 = %v", q)
	}
	if q := quantile(ds, 0.5); q != 5 {
		t.Errorf("p50 = %v", q)
	}
}

// A run whose checks did not finish (the history read timed out) must not
// print PASS, even with no violation found in what was read.
func TestReportUncheckedIsNoPass(t *testing.T) {
	r := &Report{Soak: time.Minute, Unchecked: "context deadline exceeded"}
	if r.OK() {
		t.Error("OK() = true for a run whose checks did not finish")
	}
	var out strings.Builder
	r.Print(&out)
	first, _, _ := strings.Cut(out.String(), "\n")
	if strings.Contains(first, "PASS") || !strings.Contains(first, "INCOMPLETE (not checked: context deadline exceeded)") {
		t.Errorf("verdict line = %q, want INCOMPLETE with the reason and no PASS", first)
	}
	r.Violations = []string{"item x stuck"}
	out.Reset()
	r.Print(&out)
	if first, _, _ = strings.Cut(out.String(), "\n"); !strings.Contains(first, "FAIL") {
		t.Errorf("verdict line = %q, want FAIL when a violation was found", first)
	}
}
