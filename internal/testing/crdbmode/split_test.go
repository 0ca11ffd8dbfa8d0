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

// A transaction's own setting of the idle timeout goes to a placeholder,
// the connection's setting stays.
func TestLocalIdleTimeoutChangesNothing(t *testing.T) {
	t.Parallel()
	for query, want := range map[string]string{
		"SELECT deadline, set_config('idle_in_transaction_session_timeout',\n  GREATEST(1, $2)::TEXT || 'ms',\n  true) AS idle FROM sessions": "SELECT deadline, set_config('crdb.idle_in_transaction_session_timeout',\n  GREATEST(1, $2)::TEXT || 'ms', true) AS idle FROM sessions",
		"SELECT set_config('lock_timeout', $1, false), set_config('idle_in_transaction_session_timeout', $2, false)":                          "SELECT set_config('lock_timeout', $1, false), set_config('idle_in_transaction_session_timeout', $2, false)",
	} {
		if got := localIdleTimeout(query); got != want {
			t.Errorf("localIdleTimeout(%q) = %q, want %q", query, got, want)
		}
	}
}
