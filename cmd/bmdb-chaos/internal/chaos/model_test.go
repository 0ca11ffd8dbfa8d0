package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/google/uuid"
)

// The model accepts what bmdb may do and rejects what it must not, and a
// rejection names the operations that cannot come next.
func TestClaimModel(t *testing.T) {
	c1, c2 := uuid.New(), uuid.New()
	claim := func(c uuid.UUID, token, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: modelInput{kind: opClaim, claim: c, src: "worker 0 op 1"},
			Output: modelOutput{token: token, out: outOK}, Call: call, Return: ret, Metadata: "worker 0 op 1"}
	}
	end := func(kind string, c uuid.UUID, out string, applied bool, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: modelInput{kind: kind, claim: c, src: "worker 1 op 2"},
			Output: modelOutput{out: out, applied: applied}, Call: call, Return: ret, Metadata: "worker 1 op 2"}
	}
	abandon := func(c uuid.UUID, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: modelInput{kind: dbEnd, claim: c, src: "db history 3"},
			Output: modelOutput{out: outOK, event: "Abandoned"}, Call: call, Return: ret, Metadata: "db history 3"}
	}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want []string // in the violation; none: linearizable
	}{
		{"finish then claim again", []porcupine.Operation{claim(c1, 1, 0, 10), end(opFinish, c1, outOK, true, 20, 30), claim(c2, 2, 40, 50)}, nil},
		{"takeover, overlapping the abandon", []porcupine.Operation{claim(c1, 1, 0, 10), claim(c2, 2, 20, 50), abandon(c1, 30, 40),
			end(opFinish, c1, outLost, false, 45, 60)}, nil},
		{"ambiguous finish that committed", []porcupine.Operation{claim(c1, 1, 0, 10), end(opFinish, c1, outAmbiguous, true, 20, 30),
			end(opCancel, c1, outLost, false, 40, 50)}, nil},
		{"expired locally, claim still held", []porcupine.Operation{claim(c1, 1, 0, 10), end(opFinish, c1, outExpired, false, 20, 30)}, nil},
		{"two holders", []porcupine.Operation{claim(c1, 1, 0, 10), claim(c2, 2, 20, 30)},
			[]string{"held by " + short(c1), "claim " + short(c2) + " -> token 2"}},
		{"token repeated", []porcupine.Operation{claim(c1, 1, 0, 10), end(opFail, c1, outOK, true, 20, 30), claim(c2, 1, 40, 50)},
			[]string{"free, last token 1", "claim " + short(c2) + " -> token 1"}},
		{"finish seen ok, not recorded", []porcupine.Operation{claim(c1, 1, 0, 10), end(opFinish, c1, outOK, false, 20, 30)},
			[]string{"finish " + short(c1) + " -> ok, not in work_history"}},
		{"lost, yet recorded", []porcupine.Operation{claim(c1, 1, 0, 10), end(opFinish, c1, outLost, true, 20, 30)},
			[]string{"finish " + short(c1) + " -> lost, in work_history"}},
		{"lost while held", []porcupine.Operation{claim(c1, 1, 0, 10), end(opCancel, c1, outLost, false, 20, 30), abandon(c1, 40, 50)},
			[]string{"cancel " + short(c1) + " -> lost"}},
	} {
		r := &Report{}
		dir := t.TempDir()
		m := uuid.New()
		checkModel(r, map[uuid.UUID][]porcupine.Operation{m: tc.ops}, dir)
		switch {
		case tc.want == nil && len(r.Violations) > 0:
			t.Errorf("%s: %q", tc.name, r.Violations)
		case tc.want != nil && len(r.Violations) != 1:
			t.Errorf("%s: violations %q, want one", tc.name, r.Violations)
		case tc.want != nil:
			for _, w := range tc.want {
				if !strings.Contains(r.Violations[0], w) {
					t.Errorf("%s: violation %q does not mention %q", tc.name, r.Violations[0], w)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "model-"+m.String()+".html")); err != nil {
				t.Errorf("%s: no visualisation: %v", tc.name, err)
			}
		}
	}
}

// The workers' and the database's records become one history per item:
// a client end is the end work_history recorded when it is of its kind,
// and what no client did is the database's own operation.
func TestMachineHistories(t *testing.T) {
	m, c1, c2, s := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	t0 := time.Unix(1000, 0)
	ops := []*op{
		{record: record{ID: "1.1", Kind: opClaim, Call: 1, Return: 2, Out: outOK, Claims: []claimed{{Machine: m, Claim: c1, Token: 1}}}},
		{record: record{ID: "1.2", Kind: opFinish, Machine: m, Claim: c1, Call: 3, Out: outUnknown}}, // killed
	}
	events := []dbEvent{
		{id: 1, machine: m, session: s, claim: c1, event: "Started", token: 1, at: t0, commit: t0},
		{id: 2, machine: m, session: s, claim: c1, event: "Finished", at: t0.Add(time.Second), commit: t0.Add(time.Second)},
		{id: 3, machine: m, session: s, claim: c2, event: "Started", token: 2, at: t0.Add(2 * time.Second), commit: t0.Add(2 * time.Second)},
		{id: 4, machine: m, session: s, claim: c2, event: "Abandoned", at: t0.Add(3 * time.Second), commit: t0.Add(3 * time.Second)},
	}
	// A Cancel the client saw refused by its session's local end: the
	// Canceled row is the closing session's.
	c3 := uuid.New()
	ops = append(ops,
		&op{record: record{ID: "1.3", Kind: opClaim, Call: 5e9, Return: 5e9 + 1, Out: outOK, Claims: []claimed{{Machine: m, Claim: c3, Token: 3}}}},
		&op{record: record{ID: "1.4", Kind: opCancel, Machine: m, Claim: c3, Call: 6e9, Return: 6e9, Out: outExpired}})
	events = append(events,
		dbEvent{id: 5, machine: m, session: s, claim: c3, event: "Started", token: 3, at: t0.Add(5 * time.Second), commit: t0.Add(5 * time.Second)},
		dbEvent{id: 6, machine: m, session: s, claim: c3, event: "Canceled", at: t0.Add(7 * time.Second), commit: t0.Add(7 * time.Second)})
	h := machineHistories(ops, events, t0.UnixNano())[m]
	var got []string
	for _, o := range withClients(h) {
		got = append(got, describeOp(o.Input, o.Output))
	}
	want := []string{
		"claim " + short(c1) + " -> token 1",
		"finish " + short(c1) + " -> unknown, in work_history",
		"db-claim " + short(c2) + " -> token 2",
		"db-end " + short(c2) + " (Abandoned)",
		"claim " + short(c3) + " -> token 3",
		"cancel " + short(c3) + " -> expired, not in work_history",
		"db-end " + short(c3) + " (Canceled)",
	}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("history %q, want %q", got, want)
	}
	r := &Report{}
	checkModel(r, map[uuid.UUID][]porcupine.Operation{m: h}, "")
	if len(r.Violations) > 0 {
		t.Errorf("violations %q", r.Violations)
	}
}
