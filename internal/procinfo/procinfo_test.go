package procinfo

import (
	"os"
	"strings"
	"testing"
)

// DescribeRun names who ran the program from $USER, and nobody without
// one (it said "run by " then, with nobody after it).
func TestDescribeRun(t *testing.T) {
	t.Setenv("USER", "alice")
	if got, want := DescribeRun(), Describe()+", run by alice"; got != want {
		t.Errorf("DescribeRun with USER=alice = %q, want %q", got, want)
	}
	os.Unsetenv("USER") // t.Setenv restores it
	if got := DescribeRun(); got != Describe() || strings.Contains(got, "run by") {
		t.Errorf("DescribeRun without USER = %q, want %q", got, Describe())
	}
	t.Setenv("USER", "")
	if got := DescribeRun(); got != Describe() {
		t.Errorf("DescribeRun with USER empty = %q, want %q", got, Describe())
	}
}
