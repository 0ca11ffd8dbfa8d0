package main

import (
	"errors"
	"flag"
	"strings"
	"time"
)

// durationFormat is what a duration flag expects, for its error.
const durationFormat = "want a duration such as 90s, 15m or 720h: a number and a unit (ns, us, ms, s, m, h; no d)"

// durationFlag is a time.Duration flag whose parse error names the expected
// format (package flag's own says only "parse error").
type durationFlag time.Duration

// durationVar defines a duration flag with the given default, stored in p.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*durationFlag)(p), name, usage)
}

// duration defines a duration flag with the given default.
func duration(fs *flag.FlagSet, name string, value time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	durationVar(fs, p, name, value, usage)
	return p
}

// Set implements flag.Value.
func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New(durationFormat)
	}
	*d = durationFlag(v)
	return nil
}

// String implements flag.Value; package flag may call it on a nil d.
func (d *durationFlag) String() string {
	if d == nil {
		return "0s"
	}
	return time.Duration(*d).String()
}

// flagError restates an error of package flag as bmdbctl's command line
// spells it: --since rather than -since, and what a number or a boolean
// should look like rather than "parse error". (Duration flags say what they
// want themselves: durationFlag.)
func flagError(err error) error {
	msg := err.Error()
	for _, p := range []string{"defined: -", "argument: -", "for flag -", "for -"} {
		msg = strings.Replace(msg, p, p+"-", 1)
	}
	if rest, ok := strings.CutSuffix(msg, ": parse error"); ok {
		want := "want an integer"
		if strings.HasPrefix(msg, "invalid boolean value") {
			want = "want true or false"
		}
		msg = rest + ": " + want
	}
	return usagef("%s", msg)
}
