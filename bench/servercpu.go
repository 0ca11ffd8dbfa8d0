package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The server's CPU time, read from /proc when the server runs on this
// machine (as scripts/with-pg's does): the postmaster's children's user and
// system time (every backend and background process: walwriter,
// checkpointer, autovacuum), plus the postmaster's own and that of its
// children that have exited (cutime, cstime: the postmaster reaps them).

// userHZ is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// serverProcs reads the CPU time of one PostgreSQL server's processes.
type serverProcs struct {
	postmaster int
}

// findServer returns the processes of db's server if it runs here (a
// backend of it is a local process titled "postgres: ..."), or nil.
func findServer(ctx context.Context, db *sql.DB) *serverProcs {
	var pid int
	if err := db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return nil
	}
	if !isBackend(pid) {
		return nil
	}
	st, err := readStat(pid)
	if err != nil {
		return nil
	}
	return &serverProcs{postmaster: st.ppid}
}

// isBackend reports whether local process pid is titled as a PostgreSQL
// backend.
func isBackend(pid int) bool {
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.HasPrefix(cmd, []byte("postgres: "))
}

// procStat is what the bench reads of /proc/<pid>/stat.
type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64 // in USER_HZ ticks
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no comm", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state): field n is f[n-3].
	var st procStat
	var errs [5]error
	st.ppid, errs[0] = strconv.Atoi(f[1])
	st.utime, errs[1] = strconv.ParseInt(f[11], 10, 64)
	st.stime, errs[2] = strconv.ParseInt(f[12], 10, 64)
	st.cutime, errs[3] = strconv.ParseInt(f[13], 10, 64)
	st.cstime, errs[4] = strconv.ParseInt(f[14], 10, 64)
	for _, err := range errs {
		if err != nil {
			return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return st, nil
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// cpu returns the CPU time the server's processes have used so far.
func (s *serverProcs) cpu() (time.Duration, error) {
	pm, err := readStat(s.postmaster)
	if err != nil {
		return 0, err
	}
	total := pm.utime + pm.stime + pm.cutime + pm.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != s.postmaster {
			continue // gone meanwhile, or not the server's
		}
		total += st.utime + st.stime
	}
	return ticks(total), nil
}

// backendCPU returns the CPU time backend pid has used so far.
func backendCPU(pid int) (time.Duration, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return ticks(st.utime + st.stime), nil
}
