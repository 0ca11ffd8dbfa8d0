package fleet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// bmdb keeps no list of processes: a process is known once the database
// has a trace of it, a claim, history, a backoff or a controls row. An
// operator's control of a process it does not know is most likely a typo
// (bmdbctl and package web refuse it unless told it is a new process).

// Queries of the processes: constant text, parameters as values.
const (
	processKnownSQL = `SELECT EXISTS (SELECT 1 FROM process_controls WHERE process = $1)
    OR EXISTS (SELECT 1 FROM work_history WHERE process = $1)
    OR EXISTS (SELECT 1 FROM work_backoff WHERE process = $1)
    OR EXISTS (SELECT 1 FROM work WHERE process = $1)`
	// knownProcessesSQL skips through the (process, ...) indexes of
	// work_history and work_backoff, one probe per process (a loose index
	// scan, as both engines run it), instead of reading every row; work
	// holds only the claims in flight and process_controls a row per
	// process.
	knownProcessesSQL = `WITH RECURSIVE h (process) AS (
    (SELECT process FROM work_history ORDER BY process LIMIT 1)
    UNION ALL
    SELECT (SELECT x.process FROM work_history x WHERE x.process > h.process ORDER BY x.process LIMIT 1)
    FROM h WHERE h.process IS NOT NULL
), b (process) AS (
    (SELECT process FROM work_backoff ORDER BY process LIMIT 1)
    UNION ALL
    SELECT (SELECT x.process FROM work_backoff x WHERE x.process > b.process ORDER BY x.process LIMIT 1)
    FROM b WHERE b.process IS NOT NULL
)
SELECT process FROM h WHERE process IS NOT NULL
UNION SELECT process FROM b WHERE process IS NOT NULL
UNION SELECT process FROM process_controls
UNION SELECT process FROM work
ORDER BY process
LIMIT $1`
)

// MaxKnownProcesses bounds KnownProcesses.
const MaxKnownProcesses = 1000

// ErrUnknownProcess is wrapped by *UnknownProcessError.
var ErrUnknownProcess = errors.New("fleet: unknown process")

// UnknownProcessError says that the database knows no process named
// Process, and which it knows.
type UnknownProcessError struct {
	Process string
	// Near is the known process whose name is closest to Process, if one
	// is close enough to be a typo's target; else "".
	Near string
	// Known are the known processes, by name (KnownProcesses).
	Known []string
}

// shownKnown is how many known processes an UnknownProcessError's message
// lists.
const shownKnown = 20

// Error says that the process is unknown, what it might have meant, and
// the known processes (at most 20 of them).
func (e *UnknownProcessError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "process %q is unknown (no claims, history, backoffs or controls yet)", e.Process)
	b.WriteString("; ")
	if e.Near != "" {
		fmt.Fprintf(&b, "did you mean %q? ", e.Near)
	}
	switch n := len(e.Known); {
	case n == 0:
		b.WriteString("no process is known yet")
	case n <= shownKnown:
		fmt.Fprintf(&b, "known processes: %s", strings.Join(e.Known, ", "))
	default:
		fmt.Fprintf(&b, "known processes: %s and %d more", strings.Join(e.Known[:shownKnown], ", "), n-shownKnown)
	}
	return b.String()
}

// Unwrap returns ErrUnknownProcess.
func (e *UnknownProcessError) Unwrap() error { return ErrUnknownProcess }

// CheckProcessKnown returns nil if the database knows process, and an
// *UnknownProcessError if not.
func CheckProcessKnown(ctx context.Context, db *sql.DB, process string) error {
	var known bool
	if err := db.QueryRowContext(ctx, processKnownSQL, process).Scan(&known); err != nil {
		return fmt.Errorf("fleet: is %q known: %w", process, err)
	}
	if known {
		return nil
	}
	all, err := KnownProcesses(ctx, db)
	if err != nil {
		return err
	}
	return &UnknownProcessError{Process: process, Near: nearest(process, all), Known: all}
}

// KnownProcesses returns the processes with a claim, history, a backoff
// or a controls row, by name, at most MaxKnownProcesses of them.
func KnownProcesses(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, knownProcessesSQL, MaxKnownProcesses)
	if err != nil {
		return nil, fmt.Errorf("fleet: reading the known processes: %w", err)
	}
	defer rows.Close()
	known := []string{}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("fleet: reading the known processes: %w", err)
		}
		known = append(known, p)
	}
	return known, rows.Err()
}

// nearest returns the name of known closest to name (edit distance,
// ignoring case) if it is close enough to be what name misspells: at
// most 2 edits, or a third of name's length; else "".
func nearest(name string, known []string) string {
	best, bestD := "", -1
	for _, k := range known {
		if d := distance(strings.ToLower(name), strings.ToLower(k)); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	n := utf8.RuneCountInString(name)
	if bestD < 0 || bestD >= n || bestD > max(2, n/3) {
		return ""
	}
	return best
}

// distance is the Levenshtein distance between a and b, in runes.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev, cur := make([]int, len(rb)+1), make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			sub := prev[j-1]
			if ra[i-1] != rb[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
