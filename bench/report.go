package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// latencies collects durations and reports percentiles.
type latencies []time.Duration

// pct returns the p-th percentile (0 < p <= 100), or 0 without samples.
func (l latencies) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// result is one measured run of one system at one worker count.
type result struct {
	items     int
	elapsed   time.Duration
	attempts  int64 // transaction attempts (bmdb)
	retries   int64 // serialization retries (bmdb: conn.Stats)
	conflicts int64 // ErrWorkConflict returned by Work
	empty     int64 // ErrNothingToDo returned by Work
	claims    latencies
	at        []time.Duration // when each claim was made, since the start
}

func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.items) / r.elapsed.Seconds()
}

// median returns the result with the median rate of rs.
func median(rs []result) result {
	if len(rs) == 0 {
		return result{}
	}
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b result) int {
		switch {
		case a.rate() < b.rate():
			return -1
		case a.rate() > b.rate():
			return 1
		}
		return 0
	})
	return s[len(s)/2]
}

// table prints aligned columns.
type table struct {
	w *tabwriter.Writer
}

func newTable(out io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) { fmt.Fprintln(t.w, strings.Join(cells, "\t")+"\t") }

func (t *table) flush() { t.w.Flush() }

func f0(v float64) string { return fmt.Sprintf("%.0f", v) }

func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return f2(a / b)
}
