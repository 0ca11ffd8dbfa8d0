// Command bmdbctl is the operator's tool for a bmdb database: schema
// migrations, what sessions, claims and backoffs exist now, a machine's
// history, clearing a backoff, garbage collection and history retention.
//
//	bmdbctl [flags] COMMAND [flags] [args]
//
// Commands:
//
//	migrate up | down [--steps N] | version
//	migrate lock | unlock          show, or clear, the migration lock
//	sessions                       live sessions, with seconds until their deadline
//	work [--process P]             current claims, with their component and age
//	backoffs [--process P]         backoffs in force, with cause and time left
//	machines [--stage S] [--after ID] [--limit N]
//	machine ID                     one machine: stage, claims, backoffs, recent history
//	history --machine ID [--process P] [--since D] [--limit N]
//	history prune --older-than D [--batch N]
//	backoff clear --machine ID --process P [--reason R]
//	gc                             delete expired sessions once
//	serve [--addr HOST:PORT]       serve the read-only web pages (package web)
//
// Every command takes --dsn (default $BMDB_DSN), --json (machine-readable
// output instead of a table) and --timeout. Exit status: 0 on success, 1 on
// a failure, 2 on a usage error. The DSN's password is never printed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// common are the flags every command takes.
type common struct {
	dsn     string
	json    bool
	timeout time.Duration
	out     io.Writer
}

// command is one subcommand: its flags are added to fs, run gets the
// remaining arguments.
type command struct {
	name    string
	summary string
	flags   func(fs *flag.FlagSet) func(ctx context.Context, c *common, args []string) error
}

var commands = []command{
	{"migrate", "migrate up | down [--steps N] | version | lock | unlock", migrateCommand},
	{"sessions", "live sessions", sessionsCommand},
	{"work", "current claims [--process P]", workCommand},
	{"backoffs", "backoffs in force [--process P]", backoffsCommand},
	{"machines", "machines and their stage [--stage S] [--after ID] [--limit N]", machinesCommand},
	{"machine", "one machine: stage, claims, backoffs, recent history", machineCommand},
	{"history", "history --machine ID [--process P] [--since D] | history prune --older-than D", historyCommand},
	{"backoff", "backoff clear --machine ID --process P [--reason R]", backoffCommand},
	{"gc", "delete expired sessions once", gcCommand},
	{"serve", "serve the read-only web pages [--addr 127.0.0.1:8080]", serveCommand},
}

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout)
	var usage *usageError
	switch {
	case err == nil:
	case errors.As(err, &usage):
		fmt.Fprintf(os.Stderr, "bmdbctl: %v\n(bmdbctl help lists the commands)\n", err)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "bmdbctl: %v\n", err)
		os.Exit(1)
	}
}

// run parses args and runs one command, writing its output to out.
func run(ctx context.Context, args []string, out io.Writer) error {
	// Common flags may also come before the command.
	global := flag.NewFlagSet("bmdbctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	defaults := common{out: out}
	addCommonFlags(global, &defaults, common{dsn: os.Getenv("BMDB_DSN"), timeout: 30 * time.Second})
	if err := global.Parse(args); err != nil {
		return usagef("%v", err)
	}
	args = global.Args()
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(out, "usage: bmdbctl COMMAND [--dsn DSN] [--json] [flags] [args]\n\ncommands:")
		for _, c := range commands {
			fmt.Fprintf(out, "  %-10s %s\n", c.name, c.summary)
		}
		return nil
	}
	for _, cmd := range commands {
		if cmd.name != args[0] {
			continue
		}
		fs := flag.NewFlagSet("bmdbctl "+cmd.name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c := &common{out: out}
		addCommonFlags(fs, c, defaults)
		runCmd := cmd.flags(fs)
		rest, err := parseInterspersed(fs, args[1:])
		if err != nil {
			return usagef("%s: %v", cmd.name, err)
		}
		if c.dsn == "" {
			return usagef("%s: no database: pass --dsn or set BMDB_DSN", cmd.name)
		}
		if c.timeout <= 0 {
			return usagef("%s: --timeout must be positive", cmd.name)
		}
		ctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		return runCmd(ctx, c, rest)
	}
	return usagef("unknown command %q", args[0])
}

// addCommonFlags adds the flags every command takes to fs, storing into c,
// with the values of defaults as defaults.
func addCommonFlags(fs *flag.FlagSet, c *common, defaults common) {
	fs.StringVar(&c.dsn, "dsn", defaults.dsn, "database DSN (default $BMDB_DSN)")
	fs.BoolVar(&c.json, "json", defaults.json, "print JSON instead of a table")
	fs.DurationVar(&c.timeout, "timeout", defaults.timeout, "give up after this long")
}

// parseInterspersed parses flags that may come before, between or after
// positional arguments, and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return rest, nil
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// open connects for reading and operator writes, without migrating: the
// schema must be the one this binary knows (bmdbctl migrate up fixes that).
func (c *common) open(ctx context.Context) (*bmdb.Connection, error) {
	return bmdb.Open(ctx, bmdb.Config{
		DSN:            c.dsn,
		ComponentName:  "bmdbctl",
		RuntimeInfo:    runtimeInfo(),
		SkipMigrations: true,
		MaxOpenConns:   4,
	})
}

func runtimeInfo() string {
	host, _ := os.Hostname()
	user := os.Getenv("USER")
	return fmt.Sprintf("bmdbctl by %s on %s, pid %d", user, host, os.Getpid())
}
