package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/migrations"
)

// readmeBlock returns the code block of README.md (```sh, or ```lang)
// that follows the comment naming test, without the indentation of a
// block in a list item, so that the test runs what the README shows.
func readmeBlock(t *testing.T, test string, lang ...string) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "<!-- "+test+" ")
	if !ok {
		t.Fatalf("README.md has no <!-- %s ... --> comment before the block it runs", test)
	}
	_, after, _ = strings.Cut(after, "-->\n")
	fence := "```" + append(lang, "sh")[0]
	first, after, _ := strings.Cut(after, "\n")
	indent, ok := strings.CutSuffix(first, fence)
	if !ok || strings.Trim(indent, " ") != "" {
		t.Fatalf("README.md's comment naming %s is not followed by a %s block", test, fence)
	}
	var block strings.Builder
	for line := range strings.Lines(after) {
		if line == indent+"```\n" {
			return block.String()
		}
		block.WriteString(strings.TrimPrefix(line, indent))
	}
	t.Fatalf("README.md's block for %s does not end", test)
	return ""
}

// sh runs script with sh -e in dir, with env added to the test's
// environment, and returns its standard output; it fails t with the
// output of both if the script fails.
func sh(t *testing.T, dir, script string, env ...string) string {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v running:\n%s\nstdout:\n%s\nstderr:\n%s", err, script, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// The README's steps for a new module work as they are, in a module
// outside the repository, with bmdb "cloned" beside it (the checkout,
// linked): bmdb_schema.sql is bmdb's schema, go mod tidy keeps bmdb
// required before any code imports it, and the README's first program
// then builds there. The go commands use the machine's module cache and
// GOPROXY, as a user's do.
func TestREADMENewModule(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	steps := readmeBlock(t, "TestREADMENewModule")
	checkout, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(checkout, filepath.Join(dir, "bmdb")); err != nil {
		t.Fatal(err)
	}
	env := []string{"GOFLAGS=-mod=mod", "GOWORK=off"}
	sh(t, dir, steps, env...)

	module := filepath.Join(dir, "firmware")
	goMod, err := os.ReadFile(filepath.Join(module, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"github.com/bmdb-dev/bmdb v0.0.0-00010101000000-000000000000", // still required after go mod tidy
		"replace github.com/bmdb-dev/bmdb => ../bmdb",
		"tool github.com/bmdb-dev/bmdb/cmd/bmdb-schema",
	} {
		if !strings.Contains(string(goMod), want) {
			t.Errorf("go.mod after the README's steps lacks %q:\n%s", want, goMod)
		}
	}
	schema, err := os.ReadFile(filepath.Join(module, "bmdb_schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if want, err := migrations.Schema(); err != nil || string(schema) != want {
		t.Errorf("bmdb_schema.sql is not bmdb's schema (%d bytes, want %d; %v)", len(schema), len(want), err)
	}

	// Code that imports bmdb: the README's first program.
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(module, "main.go"), program, 0o644); err != nil {
		t.Fatal(err)
	}
	sh(t, module, "go mod tidy && go build -o /dev/null . && go vet .", env...)
	goMod, _ = os.ReadFile(filepath.Join(module, "go.mod"))
	if !regexp.MustCompile(`(?m)^\s+github.com/bmdb-dev/bmdb v0.0.0-00010101000000-000000000000$`).Match(goMod) {
		t.Errorf("go.mod does not require bmdb directly once code imports it:\n%s", goMod)
	}

	// The README's test of that program passes with go test and nothing
	// set: the test binary starts a PostgreSQL of its own, and leaves
	// nothing of it in its TMPDIR.
	t.Run("go_test", func(t *testing.T) {
		test := readmeBlock(t, "TestREADMENewModule/go_test", "go")
		if err := os.WriteFile(filepath.Join(module, "main_test.go"), []byte(test), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := t.TempDir()
		for _, d := range []string{tmp, filepath.Dir(tmp)} {
			if err := os.Chmod(d, 0o755); err != nil { // for the user postgres, as root
				t.Fatal(err)
			}
		}
		out := sh(t, module, "go test -count=1 -v ./...", append(env, "BMDB_TEST_DSN=", "TMPDIR="+tmp)...)
		if !strings.Contains(out, "--- PASS: TestRun") || !strings.Contains(out, "ran on a PostgreSQL of their own") {
			t.Errorf("go test in the new module:\n%s", out)
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("go test left %s in its TMPDIR", left[0].Name())
		}
	})
}

// The README's block for a database of one's own starts a PostgreSQL and
// gives its DSN, which connects, and stops it, removing its directory.
func TestREADMEOwnDatabase(t *testing.T) {
	t.Parallel()
	block := readmeBlock(t, "TestREADMEOwnDatabase")
	start, stop, ok := strings.Cut(block, "scripts/pg-stop")
	if !ok {
		t.Fatalf("the README's block does not stop the database with scripts/pg-stop:\n%s", block)
	}
	stop = "scripts/pg-stop" + stop
	home := t.TempDir()
	// As root, pg-start runs PostgreSQL as the postgres user, which must
	// reach the directory.
	for _, d := range []string{home, filepath.Dir(home)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := "HOME=" + home
	t.Cleanup(func() {
		exec.Command("../../scripts/pg-stop", filepath.Join(home, "pg-firmware")).Run() // if the test failed before its stop
	})
	out := sh(t, "../..", start+`echo "BMDB_DSN=$BMDB_DSN"`+"\n", env)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	printed, exported := lines[0], strings.TrimPrefix(lines[len(lines)-1], "BMDB_DSN=")
	if !strings.HasPrefix(printed, "postgres://postgres@127.0.0.1:") || exported != printed {
		t.Fatalf("pg-start printed %q and BMDB_DSN is %q: want the same DSN", printed, exported)
	}
	db, err := sql.Open("postgres", exported)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE firmware_test"); err != nil {
		t.Errorf("the README's database does not let its user create databases: %v", err)
	}
	db.Close()

	sh(t, "../..", stop, env)
	if _, err := os.Stat(filepath.Join(home, "pg-firmware")); !os.IsNotExist(err) {
		t.Errorf("pg-stop left the directory (%v)", err)
	}
}
