package dbconn

import (
	"errors"
	"strings"
	"testing"
)

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:p4ss@h:5432/db?sslmode=verify-full", "postgres://u:xxxxx@h:5432/db?sslmode=verify-full"},
		{"postgres://u@h/db?password=p4ss", "postgres://u@h/db?password=xxxxx"},
		{"host=h user=u password=p4ss dbname=db", "host=h user=u password=xxxxx dbname=db"},
		{"host=h password='p 4ss' dbname=db", "host=h password=xxxxx dbname=db"},
		{"host=h dbname=db", "host=h dbname=db"},
	} {
		if got := RedactDSN(tc.in); got != tc.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	err := RedactError(errors.New("failed for postgres://u:p4ss@h/db: p4ss"), "postgres://u:p4ss@h/db")
	if strings.Contains(err.Error(), "p4ss") {
		t.Errorf("RedactError left the password: %v", err)
	}
}
