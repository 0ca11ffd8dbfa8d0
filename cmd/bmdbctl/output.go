package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// table is command output: a header and rows for people, the same records
// as JSON objects for scripts.
type table struct {
	header  []string
	rows    [][]string
	records []any
}

func (t *table) add(record any, cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		row[i] = cell(c)
	}
	t.rows = append(t.rows, row)
	t.records = append(t.records, record)
}

// print writes t as an aligned table, or as a JSON array with asJSON.
func (t *table) print(w io.Writer, asJSON bool) error {
	if asJSON {
		records := t.records
		if records == nil {
			records = []any{}
		}
		return writeJSON(w, records)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if len(t.rows) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	return tw.Flush()
}

func cell(v any) string {
	switch v := v.(type) {
	case time.Time:
		return v.UTC().Format("2006-01-02 15:04:05.000Z")
	case float64:
		return fmt.Sprintf("%.1f", v)
	case string:
		if v == "" {
			return "-"
		}
		return strings.ReplaceAll(strings.ReplaceAll(v, "\t", " "), "\n", " ")
	}
	return fmt.Sprint(v)
}

// without returns t without its column named col (JSON records unchanged).
func (t *table) without(col string) *table {
	i := slices.Index(t.header, col)
	if i < 0 {
		return t
	}
	out := &table{header: slices.Delete(slices.Clone(t.header), i, i+1), records: t.records}
	for _, r := range t.rows {
		out.rows = append(out.rows, slices.Delete(slices.Clone(r), i, i+1))
	}
	return out
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
