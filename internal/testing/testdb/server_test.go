//go:build unix

package testdb

import (
	"bufio"
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary a child of TestOwnServerGoneAfterExit:
// TestChildServer starts the server, reports it, and then returns
// ("exit") or waits to be killed or timed out ("block").
const childEnv = "BMDB_TESTDB_CHILD"

// TestChildServer is the child's test: it gets a database on the
// binary's own server and prints "server PID PORT DIR" (the postmaster's
// pid) on stdout.
func TestChildServer(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("run by TestOwnServerGoneAfterExit")
	}
	db, err := sql.Open("postgres", New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("INSERT INTO migrated VALUES (1)"); err != nil {
		t.Fatalf("the database is not migrated: %v", err)
	}
	pid, err := os.ReadFile(filepath.Join(own.dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(pid), "\n")
	port := strings.TrimPrefix(strings.TrimSuffix(own.dsn, "/postgres?sslmode=disable"), "postgres://postgres@127.0.0.1:")
	fmt.Printf("server %s %s %s\n", first, port, own.dir)
	if mode == "block" {
		time.Sleep(time.Hour)
	}
}

// A test binary that started its own server leaves neither the server
// (nor its watchdog) nor its directory behind once it has exited: when
// Run returns (at once: Run waits for them), and when the binary is
// killed or panics on go test's -timeout (soon after: the watchdog sees
// the binary's end of its pipe close). A binary that ran no test needing
// a database starts no server. Each child runs with a TMPDIR of its own,
// which must end up empty, and no process may be left whose command
// line or working directory is in it.
func TestOwnServerGoneAfterExit(t *testing.T) {
	if _, _, err := findBinaries(os.Getenv("PATH"), debianBinDirs); err != nil {
		t.Skip(err)
	}
	if _, err := os.Stat("/proc/self/cwd"); err != nil {
		t.Skip("no /proc to look for orphaned processes in")
	}

	none := runChild(t, "exit", "-test.run=^$")
	none.wait(t)
	if none.server != "" {
		t.Errorf("a binary without tests started a server: %s", none.server)
	}
	none.requireGone(t)

	exit := runChild(t, "exit")
	exit.readServer(t)
	exit.wait(t)
	if !strings.Contains(exit.stdout.String(), "PASS") {
		t.Fatalf("the child failed:\n%s\n%s", exit.stdout.String(), exit.stderr.String())
	}
	exit.requireGone(t)
	t.Logf("child exit: reported its server %v after it started", exit.ready)
	// What it took the child to report its server, with margin, bounds
	// the waits below.
	ready := 2*exit.ready + 3*time.Second

	t.Run("killed", func(t *testing.T) {
		t.Parallel()
		c := runChild(t, "block")
		c.readServer(t)
		if err := c.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		c.cmd.Wait()
		c.eventuallyGone(t, time.Minute)
	})
	t.Run("timed out", func(t *testing.T) {
		t.Parallel()
		c := runChild(t, "block", fmt.Sprintf("-test.timeout=%v", ready))
		c.readServer(t)
		c.cmd.Wait()
		if !strings.Contains(c.stderr.String(), "panic: test timed out after") {
			t.Errorf("the child did not time out:\n%s", c.stderr.String())
		}
		c.eventuallyGone(t, time.Minute)
	})
}

// child is a run of this test binary as TestChildServer.
type child struct {
	mode   string
	tmp    string // its TMPDIR
	cmd    *exec.Cmd
	stdout bytes.Buffer // what it printed, once read or waited for
	stderr bytes.Buffer
	lines  *bufio.Scanner
	begin  time.Time
	ready  time.Duration // from its start to its "server" line
	server string        // its "server" line
}

// runChild starts the child, without BMDB_TEST_DSN.
func runChild(t *testing.T, mode string, args ...string) *child {
	t.Helper()
	c := &child{mode: mode, tmp: t.TempDir()}
	// As root the server runs as the user postgres, which must reach it.
	for _, d := range []string{c.tmp, filepath.Dir(c.tmp)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.cmd = exec.Command(os.Args[0], append([]string{"-test.run=^TestChildServer$", "-test.count=1"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvDSN+"=") && !strings.HasPrefix(kv, "TMPDIR=") {
			c.cmd.Env = append(c.cmd.Env, kv)
		}
	}
	c.cmd.Env = append(c.cmd.Env, childEnv+"="+mode, "TMPDIR="+c.tmp)
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.lines = bufio.NewScanner(out)
	c.cmd.Stderr = &c.stderr
	c.begin = time.Now()
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		c.stopLeftServer()
	})
	return c
}

// readServer reads the child's output up to its "server" line, or fails
// t if it ends first.
func (c *child) readServer(t *testing.T) {
	t.Helper()
	for c.lines.Scan() {
		line := c.lines.Text()
		fmt.Fprintln(&c.stdout, line)
		if strings.HasPrefix(line, "server ") {
			c.server, c.ready = line, time.Since(c.begin)
			return
		}
	}
	c.cmd.Wait()
	t.Fatalf("child %s ended without reporting its server:\n%s\n%s", c.mode, c.stdout.String(), c.stderr.String())
}

// wait reads the rest of the child's output and waits for it to exit.
func (c *child) wait(t *testing.T) {
	t.Helper()
	for c.lines.Scan() {
		line := c.lines.Text()
		fmt.Fprintln(&c.stdout, line)
		if strings.HasPrefix(line, "server ") {
			c.server = line
		}
	}
	if err := c.cmd.Wait(); err != nil {
		t.Errorf("child %s: %v\n%s\n%s", c.mode, err, c.stdout.String(), c.stderr.String())
	}
}

// requireGone fails t if anything of the child's server is left.
func (c *child) requireGone(t *testing.T) {
	t.Helper()
	if left := c.left(); left != nil {
		t.Fatalf("child %s (%s) exited and left: %v", c.mode, c.server, left)
	}
}

// eventuallyGone polls until nothing of the child's server is left, or
// fails t after timeout.
func (c *child) eventuallyGone(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := c.left()
		if left == nil {
			t.Logf("child %s: its server was gone %v after it exited", c.mode, timeout-time.Until(deadline))
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("child %s (%s) died and left after %v: %v", c.mode, c.server, timeout, left)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopLeftServer stops the postmaster of a server the child left (when
// the test failed), so that the failure leaves no server behind.
func (c *child) stopLeftServer() {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		if bytes.Contains(cmdline, []byte("-D\x00"+c.tmp+"/")) {
			if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
				syscall.Kill(pid, syscall.SIGQUIT) // immediate shutdown
			}
		}
	}
}

// left lists what is left of the child's server: files in its TMPDIR,
// and live processes whose command line or working directory is in it.
func (c *child) left() error {
	var errs []error
	entries, err := os.ReadDir(c.tmp)
	if err != nil {
		return err
	}
	for _, e := range entries {
		errs = append(errs, fmt.Errorf("file %s", filepath.Join(c.tmp, e.Name())))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		stat, err := os.ReadFile(filepath.Join(p, "stat"))
		if err != nil {
			continue // gone
		}
		if _, after, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(after, "Z") {
			continue // a zombie: exited, not reaped by init
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		cwd, _ := os.Readlink(filepath.Join(p, "cwd"))
		if bytes.Contains(cmdline, []byte(c.tmp)) || strings.HasPrefix(cwd, c.tmp) {
			errs = append(errs, fmt.Errorf("process %s: %s (in %s)", filepath.Base(p), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), cwd))
		}
	}
	return errors.Join(errs...)
}

// findBinaries prefers initdb and pg_ctl on PATH, both; else takes the
// newest version's directory holding both; else says what to install.
func TestFindBinaries(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	exe := func(dir string, names ...string) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(tmp, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(tmp, dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return filepath.Join(tmp, dir)
	}
	both := exe("path/both", "initdb", "pg_ctl")
	onlyInitdb := exe("path/initdb", "initdb")
	exe("lib/9.6/bin", "initdb", "pg_ctl")
	exe("lib/15/bin", "initdb", "pg_ctl")
	exe("lib/16/bin", "initdb") // half installed
	glob := filepath.Join(tmp, "lib/*/bin")
	for _, tc := range []struct {
		path, glob string
		want       string // the directory of both, or "" for ErrNoServer
	}{
		{both, glob, both},
		{onlyInitdb + string(filepath.ListSeparator) + both, glob, both},
		{onlyInitdb, glob, filepath.Join(tmp, "lib/15/bin")},
		{"", filepath.Join(tmp, "lib/16/bin"), ""},
		{onlyInitdb, filepath.Join(tmp, "none/*/bin"), ""},
	} {
		initdb, pgCtl, err := findBinaries(tc.path, tc.glob)
		if tc.want == "" {
			if !errors.Is(err, ErrNoServer) {
				t.Errorf("PATH=%s, glob %s: %q, %q, %v; want ErrNoServer", tc.path, tc.glob, initdb, pgCtl, err)
			}
			continue
		}
		if err != nil || initdb != filepath.Join(tc.want, "initdb") || pgCtl != filepath.Join(tc.want, "pg_ctl") {
			t.Errorf("PATH=%s, glob %s: %q, %q, %v; want those in %s", tc.path, tc.glob, initdb, pgCtl, err, tc.want)
		}
	}
	for _, want := range []string{"BMDB_TEST_DSN is not set", "apt-get install postgresql", "point BMDB_TEST_DSN at"} {
		if !strings.Contains(ErrNoServer.Error(), want) {
			t.Errorf("ErrNoServer = %q, which does not say %q", ErrNoServer, want)
		}
	}
}

// A server that fails to start is an error carrying initdb's complaint,
// and leaves nothing in TMPDIR.
func TestStartFails(t *testing.T) {
	tmp := t.TempDir()
	for _, d := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(d, 0o755); err != nil { // for the user postgres, as root
			t.Fatal(err)
		}
	}
	initdb := filepath.Join(tmp, "initdb")
	if err := os.WriteFile(initdb, []byte("#!/bin/sh\necho 'initdb: the disk is on fire' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(tmp, "tmp")
	if err := os.Mkdir(work, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", work)
	s, err := start(initdb, "/nonexistent/pg_ctl")
	if err == nil {
		s.stop()
		t.Fatal("start succeeded with an initdb that fails")
	}
	for _, want := range []string{initdb + " failed", "the disk is on fire", "as BMDB_TEST_DSN is not set"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("start: %v; want it to say %q", err, want)
		}
	}
	if left, _ := os.ReadDir(work); len(left) != 0 {
		t.Errorf("start left %d files in TMPDIR: %s", len(left), left[0].Name())
	}
}
