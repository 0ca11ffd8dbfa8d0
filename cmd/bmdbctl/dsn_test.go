package main

import (
	"bufio"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// The DSN that scripts/with-pg prints works as printed: pasted into
// bmdbctl, it connects (it carries sslmode=disable, which the throwaway
// server needs). A server of its own, started the way make test and make
// demo start theirs.
func TestDSNAsPrintedByScripts(t *testing.T) {
	testdb.SkipOnCockroach(t, "the scripts start PostgreSQL")
	if _, err := exec.LookPath("runuser"); err != nil {
		t.Skip("no runuser: the scripts cannot start PostgreSQL here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// cat holds the server up until its stdin closes.
	cmd := exec.CommandContext(ctx, "../../scripts/with-pg", "BMDB_UNUSED_DSN", "cat")
	cmd.Env = append(cmd.Environ(), "BMDB_UNUSED_DSN=") // empty: start a server
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("with-pg: %v", err)
		}
	}()
	const prefix = "with-pg: started PostgreSQL at "
	var dsn string
	lines := bufio.NewScanner(stderr)
	var seen []string
	for dsn == "" && lines.Scan() {
		seen = append(seen, lines.Text())
		if after, found := strings.CutPrefix(lines.Text(), prefix); found {
			dsn = after
		}
	}
	if dsn == "" {
		t.Fatalf("with-pg printed no DSN; its stderr:\n%s", strings.Join(seen, "\n"))
	}
	go func() { // drain the rest, so the script never blocks on stderr
		for lines.Scan() {
		}
	}()
	if !strings.Contains(dsn, "sslmode=disable") {
		t.Errorf("printed DSN %q lacks sslmode=disable", dsn)
	}
	// As printed: migrate, then read.
	ok(t, dsn, "migrate", "up")
	if out := ok(t, dsn, "sessions"); !strings.Contains(out, "(none)") {
		t.Errorf("bmdbctl sessions with the printed DSN:\n%s", out)
	}
}
