// Command bmdbctl is the operator's tool for a bmdb database: schema
// migrations, what sessions, claims and backoffs exist now, a machine's
// history, clearing a backoff, pausing and capping a process and deleting
// its controls, garbage collection and history retention.
//
//	bmdbctl [flags] COMMAND [flags] [args]
//
// Commands:
//
//	migrate up | down [--steps N] | version [--app NAME --migrations DIR]
//	migrate force VERSION [--app NAME [--migrations DIR]]
//	                               record VERSION as the schema's, clean, after a repair
//	migrate lock | unlock          show, or clear, the migration lock
//	sessions                       live sessions, with seconds until their deadline
//	work [--process P]             current claims, with their component and age
//	backoffs [--process P]         backoffs in force, with cause and time left
//	machines [--stage S] [--process P] [--after ID] [--limit N]
//	machine ID                     one machine: stage, claims, backoffs, recent history
//	history [--machine ID] [--process P] [--since D] [--limit N]
//	                               the fleet's events, or one machine's, newest first
//	history prune --older-than D [--batch N]
//	backoff clear --machine ID --process P [--reason R]
//	pause PROCESS [--new] [--reason R] [--by NAME]
//	                               pause a process fleet-wide: no new claim of it anywhere
//	resume PROCESS [--new] [--reason R] [--by NAME]
//	cap PROCESS N | PROCESS --none [--new] [--reason R] [--by NAME]
//	                               at most N live claims of it, fleet-wide; --none removes the cap
//	controls delete PROCESS [--force] [--reason R] [--by NAME]
//	                               delete a process's controls row (--force: even if it is paused
//	                               or capped, which lifts that)
//	processes [--history [--process P] [--limit N]]
//	                               each process: paused or running, cap, live claims, last change
//	gc                             delete expired sessions once
//	serve [--addr HOST:PORT] [--operators FILE]
//	                               serve the web pages (package web): read-only, or with
//	                               action buttons for operators ($BMDB_OPERATORS too)
//
// Every command takes --dsn (default $BMDB_DSN), --json (machine-readable
// output instead of a table) and --timeout. bmdbctl -h, --help or help
// lists the commands; bmdbctl help COMMAND or COMMAND -h shows a command's
// flags with their defaults, on stdout with exit status 0.
//
// --json prints the records of a table as an array of objects, or one
// object for machine ID, whose field names are those of the web pages' JSON
// (both read package fleet's types): component_name, machine_created_at, ….
// History is listed newest first, as on the web pages.
//
// pause, resume and cap refuse a process the database does not know (no
// claims, history, backoffs or controls yet), naming the known ones and
// the nearest, since a typo would otherwise make controls of its own;
// --new controls such a process anyway.
//
// migrate prints the version of bmdb's schema and of every application's
// after up, down and version, and exits with status 1 if one is dirty (a
// migration that did not finish), saying how to tell which version the
// schema matches; after a repair, migrate force VERSION records it, clean.
// bmdbctl embeds bmdb's migrations only: --app NAME --migrations DIR gives
// it an application's files.
//
// Exit status: 0 on success, 1 on a failure, 2 on a usage error (message on
// stderr). The DSN's password is never printed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/procinfo"
	"github.com/bmdb-dev/bmdb/migrations"
)

// usageError is a mistake in the command line: exit status 2. cmd names
// the command it is about, if any.
type usageError struct{ cmd, msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// common are the flags every command takes.
type common struct {
	dsn     string
	json    bool
	timeout time.Duration
	out     io.Writer
}

// timeoutDefault is --timeout's default.
const timeoutDefault = 30 * time.Second

// command is one subcommand: its flags are added to fs, run gets the
// remaining arguments.
type command struct {
	name     string
	synopsis []string // its forms, for help
	summary  string
	flags    func(fs *flag.FlagSet) runFunc
}

var commands = []command{
	{"migrate", []string{"migrate up | down [--steps N] | version [--app NAME --migrations DIR]", "migrate force VERSION [--app NAME [--migrations DIR]]", "migrate lock | unlock"},
		"apply or revert schema migrations and show the versions (exit 1 if one is dirty); force a version after a repair; show or clear the migration lock", migrateCommand},
	{"sessions", []string{"sessions"}, "live sessions, with seconds until their deadline", sessionsCommand},
	{"work", []string{"work [--process P] [--limit N]"}, "current claims, with their component and age", workCommand},
	{"backoffs", []string{"backoffs [--process P] [--limit N]"}, "backoffs in force, with cause and time left", backoffsCommand},
	{"machines", []string{"machines [--stage S] [--process P] [--after ID] [--limit N]"}, "machines with their stage, claims and backoffs, in pages", machinesCommand},
	{"machine", []string{"machine ID [--limit N]"}, "one machine: stage, claims, backoffs, recent history (newest first)", machineCommand},
	{"history", []string{"history [--machine ID] [--process P] [--since D] [--limit N]", "history prune --older-than D [--batch N]"},
		"the fleet's events, or one machine's, newest first; prune deletes old events of every machine", historyCommand},
	{"backoff", []string{"backoff clear --machine ID --process P [--reason R]"}, "clear a backoff, recorded as BackoffCleared", backoffCommand},
	{"pause", []string{"pause PROCESS [--new] [--reason R] [--by NAME]"}, "pause a process fleet-wide: no new claim of it commits anywhere until resume (held claims end normally); --new for a process the database does not know yet", pauseCommand},
	{"resume", []string{"resume PROCESS [--new] [--reason R] [--by NAME]"}, "end a pause: components claim again at their next poll", resumeCommand},
	{"cap", []string{"cap PROCESS N [--new] [--reason R] [--by NAME]", "cap PROCESS --none"}, "cap a process at N live claims, fleet-wide, or remove its cap", capCommand},
	{"controls", []string{"controls delete PROCESS [--force] [--reason R] [--by NAME]"}, "delete a process's controls (it leaves processes until its next claim); --force for a paused or capped one, whose pause and cap that lifts", controlsCommand},
	{"processes", []string{"processes [--history [--process P] [--limit N]]"}, "each process with controls: paused or running, its cap, live claims, last change; --history lists the changes", processesCommand},
	{"gc", []string{"gc"}, "delete expired sessions once", gcCommand},
	{"serve", []string{"serve [--addr HOST:PORT] [--operators FILE]"}, "serve the web pages (package web): read-only, or with pause, resume, cap and clear-backoff buttons for operators who sign in (--operators FILE or $BMDB_OPERATORS: NAME:TOKEN entries)", serveCommand},
}

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout)
	var usage *usageError
	switch {
	case err == nil:
	case errors.As(err, &usage) && usage.cmd != "":
		fmt.Fprintf(os.Stderr, "bmdbctl %s: %v\n(bmdbctl help %[1]s shows its flags)\n", usage.cmd, err)
		os.Exit(2)
	case errors.As(err, &usage):
		fmt.Fprintf(os.Stderr, "bmdbctl: %v\n(bmdbctl help lists the commands)\n", err)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "bmdbctl: %v\n", err)
		os.Exit(1)
	}
}

// run parses args and runs one command, writing its output (and help, when
// asked for) to out.
func run(ctx context.Context, args []string, out io.Writer) error {
	// Common flags may also come before the command.
	global := flag.NewFlagSet("bmdbctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	var defaults common
	addCommonFlags(global, &defaults, common{timeout: timeoutDefault})
	err := global.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return printUsage(out, global)
	case err != nil:
		return flagError(err)
	}
	if defaults.dsn == "" {
		defaults.dsn = os.Getenv("BMDB_DSN")
	}
	args = global.Args()
	switch {
	case len(args) == 0:
		return usagef("no command given")
	case args[0] == "help":
		return help(out, global, args[1:], defaults)
	}
	cmd, ok := lookup(args[0])
	if !ok {
		return usagef("unknown command %q", args[0])
	}
	err = runCommand(ctx, cmd, args[1:], defaults, out)
	var usage *usageError
	if errors.As(err, &usage) && usage.cmd == "" {
		usage.cmd = cmd.name
	}
	return err
}

// help answers bmdbctl help [COMMAND].
func help(out io.Writer, global *flag.FlagSet, args []string, defaults common) error {
	switch len(args) {
	case 0:
		return printUsage(out, global)
	case 1:
		cmd, ok := lookup(args[0])
		if !ok {
			return usagef("help: unknown command %q", args[0])
		}
		fs, _, _ := cmd.flagSet(defaults, out)
		return printCommandHelp(out, cmd, fs)
	}
	return usagef("help takes one command, got %q", args)
}

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// flagSet returns cmd's flags, the common ones with the values of defaults
// as defaults, the values they will be parsed into, and cmd's run function.
func (cmd command) flagSet(defaults common, out io.Writer) (*flag.FlagSet, *common, runFunc) {
	fs := flag.NewFlagSet("bmdbctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := &common{out: out}
	addCommonFlags(fs, c, defaults)
	return fs, c, cmd.flags(fs)
}

// runCommand parses cmd's args and runs it, or prints its help if asked.
func runCommand(ctx context.Context, cmd command, args []string, defaults common, out io.Writer) error {
	fs, c, runCmd := cmd.flagSet(defaults, out)
	rest, err := parseInterspersed(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return printCommandHelp(out, cmd, fs)
	case err != nil:
		return flagError(err)
	}
	if c.dsn == "" {
		c.dsn = defaults.dsn
	}
	if c.dsn == "" {
		return usagef("no database: pass --dsn or set $BMDB_DSN")
	}
	if c.timeout <= 0 {
		return usagef("--timeout is %v, must be positive (such as 30s)", c.timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return cliError(runCmd(ctx, c, rest))
}

// addCommonFlags adds the flags every command takes to fs, storing into c,
// with the values of defaults as defaults. --dsn has no default of its own:
// the caller falls back to $BMDB_DSN, so help never shows a password.
func addCommonFlags(fs *flag.FlagSet, c *common, defaults common) {
	fs.StringVar(&c.dsn, "dsn", "", "database DSN (default $BMDB_DSN)")
	fs.BoolVar(&c.json, "json", defaults.json, "print JSON instead of a table")
	durationVar(fs, &c.timeout, "timeout", defaults.timeout, "give up after this long")
}

// parseInterspersed parses flags that may come before, between or after
// positional arguments, and returns the positional ones. A negative
// number where a flag could be (cap P -1) is a positional argument, for
// its command to judge, not an undefined flag.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if n, ok := negativeNumber(err); ok {
				// package flag has consumed it: the rest follows.
				rest, args = append(rest, n), fs.Args()
				continue
			}
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

// negativeNumber returns the argument that package flag's err calls an
// undefined flag if it is a negative number, such as -1.
func negativeNumber(err error) (string, bool) {
	arg, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: ")
	if !ok || len(arg) < 2 || arg[0] != '-' {
		return "", false
	}
	if _, perr := strconv.ParseFloat(arg, 64); perr != nil {
		return "", false
	}
	return arg, true
}

// cliError restates an error of bmdb about its Config.DSN (which bmdbctl
// fills from --dsn or $BMDB_DSN), and every invalid argument of package
// migrations (a version migrate force does not know, too many --steps),
// in terms of the command line, as a usage error; other errors are
// returned as they are.
func cliError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, bmdb.ErrInvalidArgument) && strings.Contains(err.Error(), "Config.DSN"):
		msg := strings.ReplaceAll(err.Error(), bmdb.ErrInvalidArgument.Error()+": ", "")
		return usagef("%s", strings.ReplaceAll(msg, "Config.DSN", "--dsn (or $BMDB_DSN)"))
	case errors.Is(err, migrations.ErrInvalidArgument):
		msg := trimInvalid(err)
		for _, r := range [][2]string{{"DSN is", "--dsn (or $BMDB_DSN) is"}, {"Down: steps", "--steps"}, {"Force: ", ""}} {
			if rest, ok := strings.CutPrefix(msg, r[0]); ok {
				msg = r[1] + rest
			}
		}
		return usagef("%s", msg)
	}
	return err
}

// trimInvalid is err's message without package migrations' "invalid
// argument" prefix.
func trimInvalid(err error) string {
	return strings.ReplaceAll(err.Error(), migrations.ErrInvalidArgument.Error()+": ", "")
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

// withSession opens a Connection, runs check on it, then fn on a session
// of its own (unless check failed), and closes both: for the commands
// that act (backoff clear, pause, resume, cap, controls delete), since
// bmdb's writes go through a live session. check may be nil; it reads what
// the command must know before it acts, without a session row.
func (c *common) withSession(ctx context.Context, check func(*bmdb.Connection) error, fn func(*bmdb.Session) error) error {
	conn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if check != nil {
		if err := check(conn); err != nil {
			return err
		}
	}
	sess, err := conn.StartSession(ctx)
	if err != nil {
		return err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	return fn(sess)
}

// runtimeInfo describes this run of bmdbctl for its session row, the
// migration lease and a cleared backoff's history: who ran it, where.
func runtimeInfo() string {
	return procinfo.DescribeRun()
}
