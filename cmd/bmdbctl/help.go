package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// printUsage writes bmdbctl's usage, its commands and the common flags
// (those of global) to w: the answer to bmdbctl -h, --help and help.
func printUsage(w io.Writer, global *flag.FlagSet) error {
	fmt.Fprintln(w, "usage: bmdbctl [--dsn DSN] [--json] [--timeout D] COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nflags every command takes, before or after it:")
	if err := printFlags(w, global); err != nil {
		return err
	}
	fmt.Fprintln(w, "\n\"bmdbctl help COMMAND\" or \"bmdbctl COMMAND -h\" shows a command's flags.")
	fmt.Fprintln(w, "Exit status: 0 on success, 1 on a failure, 2 on a usage error.")
	return nil
}

// printCommandHelp writes cmd's synopsis, summary and flags (those of fs)
// with their defaults to w: the answer to bmdbctl help CMD and CMD -h.
func printCommandHelp(w io.Writer, cmd command, fs *flag.FlagSet) error {
	for i, s := range cmd.synopsis {
		prefix := "usage:"
		if i > 0 {
			prefix = "      "
		}
		fmt.Fprintf(w, "%s bmdbctl %s\n", prefix, s)
	}
	fmt.Fprintf(w, "\n%s\n\nflags:\n", cmd.summary)
	return printFlags(w, fs)
}

// printFlags lists the flags of fs, as --name TYPE, with their usage and
// default (unless it is the zero value).
func printFlags(w io.Writer, fs *flag.FlagSet) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		if _, ok := f.Value.(*durationFlag); ok {
			kind = "duration"
		}
		if !isZeroDefault(f.DefValue) {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", strings.TrimSpace("--"+f.Name+" "+kind), usage)
	})
	return tw.Flush()
}

// isZeroDefault reports whether a flag's default is its type's zero value,
// which help does not show.
func isZeroDefault(v string) bool {
	return v == "" || v == "0" || v == "false" || v == "0s"
}
