package migrations

import (
	"io/fs"
	"reflect"
	"strings"
	"testing"
)

// A migration file splits at the semicolons that end statements only, and
// each statement knows the line it starts on.
func TestSplitStatements(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file string
		want []statement
	}{
		{"SELECT 1;", []statement{{"SELECT 1", 1}}},
		{"-- a; comment\nCREATE TABLE a (x INT);\n\n-- trailing; comment\n", []statement{{"CREATE TABLE a (x INT)", 2}}},
		{"INSERT INTO t VALUES ('a;b', 'it''s; here');\nSELECT \"we;ird\"", []statement{{"INSERT INTO t VALUES ('a;b', 'it''s; here')", 1}, {`SELECT "we;ird"`, 2}}},
		{"/* x; /* nested; */ y; */ SELECT 1; CREATE FUNCTION f() RETURNS INT AS $f$ SELECT 1; $f$ LANGUAGE SQL;\nSELECT $$;$$",
			[]statement{{"SELECT 1", 1}, {"CREATE FUNCTION f() RETURNS INT AS $f$ SELECT 1; $f$ LANGUAGE SQL", 1}, {"SELECT $$;$$", 2}}},
		{"SELECT E'it\\'s; escaped';\nSELECT 'a\\';\nSELECT 2", []statement{{"SELECT E'it\\'s; escaped'", 1}, {"SELECT 'a\\'", 2}, {"SELECT 2", 3}}},
		{"SELECT $1::INT; SELECT a$b FROM t;", []statement{{"SELECT $1::INT", 1}, {"SELECT a$b FROM t", 1}}},
		{"SELECT 'multi\nline;';\n\n/* a\ncomment */\nDROP TABLE t;", []statement{{"SELECT 'multi\nline;'", 1}, {"DROP TABLE t", 6}}},
		{"-- only a comment\n", nil},
		{"", nil},
		{";;", nil},
	} {
		if got := splitStatements(tc.file); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitStatements(%q) = %+v, want %+v", tc.file, got, tc.want)
		}
	}
}

// Every file of bmdb's splits into statements that each start with a
// keyword, on the line where the file has it.
func TestBmdbFilesSplit(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(FS, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("no files: %v", err)
	}
	for _, name := range names {
		body, err := fs.ReadFile(typesFS{FS: FS, cockroach: true}, name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(body), "\n")
		stmts := splitStatements(string(body))
		if len(stmts) == 0 {
			t.Errorf("%s: no statement", name)
		}
		for _, st := range stmts {
			first := strings.Fields(st.text)[0]
			if first != strings.ToUpper(first) || !strings.HasPrefix(lines[st.line-1], first) {
				t.Errorf("%s: statement %q at line %d (%q)", name, st.text, st.line, lines[st.line-1])
			}
		}
	}
}
