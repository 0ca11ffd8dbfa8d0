package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// A process is known by any trace of it: a claim, history, a backoff or a
// controls row, each alone here. An unknown one is an
// *UnknownProcessError naming the known processes and the nearest.
func TestCheckProcessKnown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, sess := open(t, "plain", nil)
	db := conn.DB()
	ids := machines(t, sess, 3)
	if _, err := sess.Work(ctx, "burn-in", one(ids[0])); err != nil { // held
		t.Fatal(err)
	}
	w, err := sess.Work(ctx, "memtest", one(ids[1]))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Fail(ctx, &bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2}, "ECC"); err != nil {
		t.Fatal(err)
	}
	if w, err = sess.Work(ctx, "install-os", one(ids[2])); err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(ctx, func(*bmdb.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := sess.PauseProcess(ctx, "firmware", bmdb.ControlChange{}); err != nil {
		t.Fatal(err)
	}
	// Leave each process one trace: burn-in its claim, memtest its
	// backoff, install-os its history, firmware its controls.
	for _, q := range []string{
		"DELETE FROM process_controls WHERE process IN ('burn-in', 'memtest', 'install-os')",
		"DELETE FROM work_history WHERE process IN ('burn-in', 'memtest')",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"burn-in", "memtest", "install-os", "firmware"} {
		if err := CheckProcessKnown(ctx, db, p); err != nil {
			t.Errorf("CheckProcessKnown(%s) = %v, want known", p, err)
		}
	}
	known, err := KnownProcesses(ctx, db)
	if want := []string{"burn-in", "firmware", "install-os", "memtest"}; err != nil || !slices.Equal(known, want) {
		t.Errorf("KnownProcesses = %v, %v; want %v", known, err, want)
	}
	for typo, near := range map[string]string{"burnin": "burn-in", "Memtest": "memtest", "nosuchprocess": "", "install_os": "install-os"} {
		err := CheckProcessKnown(ctx, db, typo)
		var u *UnknownProcessError
		if !errors.Is(err, ErrUnknownProcess) || !errors.As(err, &u) || u.Process != typo || u.Near != near || !slices.Equal(u.Known, known) {
			t.Errorf("CheckProcessKnown(%s) = %#v, want unknown, near %q", typo, err, near)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, fmt.Sprintf("process %q is unknown (no claims, history, backoffs or controls yet)", typo)) ||
			!strings.HasSuffix(msg, "known processes: burn-in, firmware, install-os, memtest") ||
			strings.Contains(msg, "did you mean") != (near != "") || near != "" && !strings.Contains(msg, fmt.Sprintf("did you mean %q?", near)) {
			t.Errorf("CheckProcessKnown(%s) says %q", typo, msg)
		}
	}
}

// A database that knows no process says so; a long list is cut short.
func TestUnknownProcessMessage(t *testing.T) {
	t.Parallel()
	conn, _ := open(t, "plain", nil)
	err := CheckProcessKnown(context.Background(), conn.DB(), "burn-in")
	if err == nil || !strings.HasSuffix(err.Error(), "; no process is known yet") {
		t.Errorf("no process known: %v", err)
	}
	var many []string
	for i := range 25 {
		many = append(many, fmt.Sprintf("p%02d", i))
	}
	msg := (&UnknownProcessError{Process: "x", Known: many}).Error()
	if !strings.HasSuffix(msg, "p18, p19 and 5 more") || strings.Contains(msg, "p20") {
		t.Errorf("25 known processes: %q", msg)
	}
}

func TestNearest(t *testing.T) {
	known := []string{"burn-in", "install-os", "memtest", "provide"}
	for name, want := range map[string]string{
		"burnin": "burn-in", "burn_in": "burn-in", "BURN-IN": "burn-in", "instal-os": "install-os", "memtset": "memtest",
		"provider": "provide", "nosuchprocess": "", "x": "", "os": "", "install-operating-system": "",
	} {
		if got := nearest(name, known); got != want {
			t.Errorf("nearest(%q) = %q, want %q", name, got, want)
		}
	}
	if got := nearest("burn-in", nil); got != "" {
		t.Errorf("nearest among none = %q", got)
	}
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"a", "", 1}, {"kitten", "sitting", 3}, {"flaw", "lawn", 2}, {"ü", "u", 1}} {
		if got := distance(tc.a, tc.b); got != tc.d {
			t.Errorf("distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}
