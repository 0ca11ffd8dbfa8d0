package crdbmode

import (
	"slices"
	"testing"
)

// A plan's full scans: sequential scans, and index scans without a
// condition, however deep; scans an index condition serves are not.
func TestPlanFullScans(t *testing.T) {
	plan := planNode{NodeType: "ModifyTable", Plans: []planNode{
		{NodeType: "Index Scan", Relation: "work", Index: "work_pkey", IndexCond: "(machine_id = $1)"},
		{NodeType: "Nested Loop", Plans: []planNode{
			{NodeType: "Seq Scan", Relation: "sessions"},
			{NodeType: "Index Only Scan", Relation: "work_history", Index: "work_history_at_idx"},
			{NodeType: "Function Scan"},
		}},
	}}
	if got, want := plan.fullScans(), []string{"sessions", "work_history@work_history_at_idx"}; !slices.Equal(got, want) {
		t.Errorf("full scans %q, want %q", got, want)
	}
}

// fullscans=off is the role's disallow_full_table_scans.
func TestFromEnvFullScans(t *testing.T) {
	for env, want := range map[string]string{"fullscans=off": "disallowed", "fullscans=on": "allowed", "retry=0": "allowed", "fullscans=no": "error"} {
		t.Setenv(EnvVar, env)
		s, err := FromEnv()
		got := map[bool]string{true: "disallowed", false: "allowed"}[s.DisallowFullTableScans]
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("%s=%s: %s (%v), want %s", EnvVar, env, got, err, want)
		}
	}
}
