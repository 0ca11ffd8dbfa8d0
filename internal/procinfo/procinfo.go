// Package procinfo describes the running program for operators: it is
// what a session's runtime_info (bmdb.Config.RuntimeInfo) and the
// migration lease's holder (migrations.Config.HolderInfo) say by default,
// so that bmdbctl sessions and the web pages tell which process on which
// host, built from what, holds a claim or the lease.
package procinfo

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
)

// Describe returns the program's name, host and pid, then its build: the
// main package's path, the module's version, the VCS revision if the
// build recorded one (+dirty for uncommitted changes), and the Go
// version. For instance:
//
//	burnin on rack7-h3, pid 4242; example.com/burnin/cmd/burnin v1.4.0 vcs 0123456789ab go1.26.8
func Describe() string {
	host, err := os.Hostname()
	if err != nil {
		host = "an unknown host"
	}
	return fmt.Sprintf("%s on %s, pid %d; %s", filepath.Base(os.Args[0]), host, os.Getpid(), build())
}

// DescribeRun returns Describe and who ran the program, as the USER
// environment variable names them: "..., run by alice". Without USER (a
// service, a container, cron) there is no one to name, and it returns
// Describe alone. For tools an operator runs, such as bmdbctl.
func DescribeRun() string {
	if user := os.Getenv("USER"); user != "" {
		return Describe() + ", run by " + user
	}
	return Describe()
}

// build describes the binary's build, from its build info.
func build() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "no build info"
	}
	parts := []string{info.Path}
	if v := info.Main.Version; v != "" {
		parts = append(parts, v)
	}
	var revision string
	var modified bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value[:min(len(s.Value), 12)]
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision != "" {
		if modified {
			revision += "+dirty"
		}
		parts = append(parts, "vcs "+revision)
	}
	return strings.Join(append(parts, info.GoVersion), " ")
}
