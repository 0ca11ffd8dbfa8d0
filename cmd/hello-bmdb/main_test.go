package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

func TestMain(m *testing.M) { os.Exit(bmdbtest.Run(m, nil)) }

// The program runs on a fresh database, as the README says.
func TestRunsOnFreshDatabase(t *testing.T) {
	if err := run(context.Background(), testdb.NewEmpty(t)); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// The README's "Using it" program is this one, verbatim.
func TestREADMEShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Using it\n")
	if !ok {
		t.Fatal(`README.md has no "## Using it" section`)
	}
	_, block, ok := strings.Cut(section, "```go\n")
	if !ok {
		t.Fatal(`"## Using it" has no Go code block`)
	}
	block, _, _ = strings.Cut(block, "```\n")
	if block != string(program) {
		t.Errorf("README.md's program differs from cmd/hello-bmdb/main.go: copy main.go into the README")
	}
}
