package crdbmode

import (
	"reflect"
	"testing"
)

// A migration file splits at the semicolons that end statements only.
func TestSplitStatements(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		script string
		want   []string
	}{
		{"SELECT 1;", []string{"SELECT 1"}},
		{"-- a; comment\nCREATE TABLE a (x INT);\n\n-- trailing; comment\n", []string{"-- a; comment\nCREATE TABLE a (x INT)"}}, // comments stay with their statement
		{"INSERT INTO t VALUES ('a;b', 'it''s; here'); SELECT \"we;ird\"", []string{"INSERT INTO t VALUES ('a;b', 'it''s; here')", `SELECT "we;ird"`}},
		{"/* x; y */ SELECT 1; CREATE FUNCTION f() RETURNS INT AS $f$ SELECT 1; $f$ LANGUAGE SQL; SELECT $$;$$", []string{"/* x; y */ SELECT 1", "CREATE FUNCTION f() RETURNS INT AS $f$ SELECT 1; $f$ LANGUAGE SQL", "SELECT $$;$$"}},
		{"-- only a comment\n", nil},
	} {
		if got := splitStatements(tc.script); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitStatements(%q) = %q, want %q", tc.script, got, tc.want)
		}
	}
}
