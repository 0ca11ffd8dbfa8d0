package chaos

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/google/uuid"
)

// The claim model: what one (machine, process) goes through, as a
// sequential object that porcupine checks each machine's history against.
// Its state is the claim that holds the pair, if any, and the highest
// fencing token given out. A claim succeeds only while no claim holds the
// pair, and its token is higher than every earlier one; an end (Finish,
// Fail, Cancel, and the database's own: a takeover's or GC's Abandoned, a
// closing session's Canceled) takes effect only for the claim that holds
// the pair, and frees it.
//
// The history joins what the workers saw with what the database recorded:
// each client end carries whether work_history holds that end of that
// claim (applied), so that an end the client saw succeed must be there, an
// end the client saw fail as lost (ErrWorkLost: the database found the
// claim gone) must not be, and must come after the claim was gone, and an
// ambiguous or unreturned one is whichever the database says. The
// database's own events (takeovers, GC, Close, and claims whose client
// never learned of them) are operations spanning their statement's clock
// to their commit timestamp.

// modelState is the state of one (machine, process).
type modelState struct {
	holder uuid.UUID // uuid.Nil: free
	token  int64
}

// modelInput is an operation of the model.
type modelInput struct {
	kind  string    // opClaim, opFinish, opFail, opCancel, dbClaim, dbEnd
	claim uuid.UUID // the claim it makes or ends
	src   string    // who: "worker 2 op 1234.56", or "db history 789"
}

// modelOutput is what came back.
type modelOutput struct {
	token   int64  // of a claim
	out     string // the client's outcome (history.go), outOK for the database's events
	applied bool   // an end: work_history holds it
	event   string // a database event: its work_history event
}

// Operations of the database itself.
const (
	dbClaim = "db-claim" // a Started row no client recorded
	dbEnd   = "db-end"   // an Abandoned row, or an end no client recorded
)

func modelStep(st, in, outp any) (bool, any) {
	s, i, o := st.(modelState), in.(modelInput), outp.(modelOutput)
	switch i.kind {
	case opClaim, dbClaim:
		if s.holder != uuid.Nil || o.token <= s.token {
			return false, s
		}
		return true, modelState{holder: i.claim, token: o.token}
	case dbEnd:
		if s.holder != i.claim {
			return false, s
		}
		return true, modelState{token: s.token}
	}
	switch {
	case o.applied && (o.out == outLost || o.out == outExpired):
		return false, s // the client was told it did not happen
	case o.applied:
		if s.holder != i.claim {
			return false, s
		}
		return true, modelState{token: s.token}
	case o.out == outOK:
		return false, s // the client was told it happened
	case o.out == outLost:
		return s.holder != i.claim, s
	}
	return true, s // expired (by the local deadline), ambiguous and not applied, or an error
}

func describeOp(in, outp any) string {
	i, o := in.(modelInput), outp.(modelOutput)
	c := short(i.claim)
	switch i.kind {
	case opClaim, dbClaim:
		return fmt.Sprintf("%s %s -> token %d", i.kind, c, o.token)
	case dbEnd:
		return fmt.Sprintf("%s %s (%s)", i.kind, c, o.event)
	}
	applied := "not in work_history"
	if o.applied {
		applied = "in work_history"
	}
	return fmt.Sprintf("%s %s -> %s, %s", i.kind, c, o.out, applied)
}

func describeState(st any) string {
	s := st.(modelState)
	if s.holder == uuid.Nil {
		return fmt.Sprintf("free, last token %d", s.token)
	}
	return fmt.Sprintf("held by %s, token %d", short(s.holder), s.token)
}

// claimModel is the model, starting in state init.
func claimModel(init modelState) porcupine.Model {
	return porcupine.Model{
		Init:              func() any { return init },
		Step:              modelStep,
		Equal:             func(a, b any) bool { return a.(modelState) == b.(modelState) },
		DescribeOperation: describeOp,
		DescribeState:     describeState,
	}
}

func short(id uuid.UUID) string { return id.String()[:8] }

// dbEvent is one work_history row of Process, with its commit timestamp.
type dbEvent struct {
	id      int64
	machine uuid.UUID
	session uuid.UUID
	claim   uuid.UUID
	event   string
	token   int64 // 0 when the row has none
	at      time.Time
	commit  time.Time

	hasToken bool   // the row has a fencing token
	xid      string // the writing transaction (xmin)
}

// dbSlack widens the database's events on the histories' clock, for the
// conversion from its clock (the same host's, read at another instant).
const dbSlack = 2 * time.Millisecond

// machineHistories turns the workers' operations and the database's
// events into one porcupine history per machine.
func machineHistories(ops []*op, events []dbEvent, offset int64) map[uuid.UUID][]porcupine.Operation {
	never := int64(math.MaxInt64 / 2) // the return of an operation that never returned
	mono := func(t time.Time) int64 { return t.UnixNano() - offset }
	hist := map[uuid.UUID][]porcupine.Operation{}
	add := func(m uuid.UUID, in modelInput, out modelOutput, call, ret int64) {
		if ret == 0 {
			ret = never
		}
		hist[m] = append(hist[m], porcupine.Operation{Input: in, Output: out, Call: call, Return: ret, Metadata: in.src})
	}
	// Each claim's end in work_history, and the client ends of each claim.
	ending := map[uuid.UUID]*dbEvent{}
	known := map[uuid.UUID]bool{} // claims some client recorded
	for i := range events {
		if e := &events[i]; e.event != "Started" {
			ending[e.claim] = e
		}
	}
	ends := map[uuid.UUID][]*op{}
	for _, o := range ops {
		switch o.Kind {
		case opClaim:
			for _, c := range o.Claims {
				known[c.Claim] = true
				in := modelInput{kind: opClaim, claim: c.Claim, src: fmt.Sprintf("worker %d op %s", o.Worker, o.ID)}
				add(c.Machine, in, modelOutput{token: c.Token, out: o.Out}, o.Call, o.Return)
			}
		case opFinish, opFail, opCancel:
			ends[o.Claim] = append(ends[o.Claim], o)
		}
	}
	attributed := map[uuid.UUID]*op{} // the client end each database end is that of
	for c, cs := range ends {
		e := ending[c]
		if e == nil {
			continue
		}
		if o := clientEnd(cs, e, mono); o != nil {
			attributed[c] = o
		}
	}
	for c, cs := range ends {
		for _, o := range cs {
			in := modelInput{kind: o.Kind, claim: c, src: fmt.Sprintf("worker %d op %s", o.Worker, o.ID)}
			add(o.Machine, in, modelOutput{out: o.Out, applied: attributed[c] == o}, o.Call, o.Return)
		}
	}
	slack := dbSlack.Nanoseconds()
	for _, e := range events {
		src := fmt.Sprintf("db history %d", e.id)
		switch {
		case e.event == "Started" && !known[e.claim]:
			add(e.machine, modelInput{kind: dbClaim, claim: e.claim, src: src}, modelOutput{token: e.token, out: outOK, event: e.event},
				mono(e.at)-slack, mono(e.commit)+slack)
		case e.event != "Started" && attributed[e.claim] == nil:
			add(e.machine, modelInput{kind: dbEnd, claim: e.claim, src: src}, modelOutput{out: outOK, event: e.event},
				mono(e.at)-slack, mono(e.commit)+slack)
		}
	}
	return hist
}

// clientEnd returns which of a claim's client ends cs the database's end
// e is, or nil if none: one of the kind e records (a worker ends a claim
// with one Finish or one Fail, and Cancels until one settles it),
// preferring one the client saw succeed, then one whose outcome it does
// not know, then the one whose interval holds e's commit, then the last.
// Only the claim's own Finish or Fail writes a Finished or Failed row, so
// one the client saw fail is chosen if it is the only one left, and the
// model finds the contradiction; a Canceled row may also be the closing
// session's (Session.Close), so a Cancel the client saw fail is not it.
func clientEnd(cs []*op, e *dbEvent, mono func(time.Time) int64) *op {
	kind := map[string]string{"Finished": opFinish, "Failed": opFail, "Canceled": opCancel}[e.event]
	var match []*op
	for _, o := range cs {
		if o.Kind == kind && (kind != opCancel || (o.Out != outLost && o.Out != outExpired)) {
			match = append(match, o)
		}
	}
	if len(match) == 0 {
		return nil
	}
	commit := mono(e.commit)
	for _, prefer := range []func(o *op) bool{
		func(o *op) bool { return o.Out == outOK },
		func(o *op) bool { return o.Out == outUnknown || o.Out == outAmbiguous || o.Out == outError },
		func(o *op) bool { return o.Call <= commit && (o.Return == 0 || commit <= o.Return) },
	} {
		for _, o := range match {
			if prefer(o) {
				return o
			}
		}
	}
	return match[len(match)-1]
}

// modelCheckTimeout bounds porcupine's search on one machine's history.
const modelCheckTimeout = 10 * time.Second

// maxVisualisations bounds the HTML files one run writes.
const maxVisualisations = 5

// checkModel checks every machine's history against the claim model,
// reporting each machine whose history is not linearizable with its
// smallest failing sub-history, and writing porcupine's visualisation of
// its history to logDir. It returns how many operations it checked.
func checkModel(r *Report, hist map[uuid.UUID][]porcupine.Operation, logDir string) int {
	machines := make([]uuid.UUID, 0, len(hist))
	n := 0
	for m, h := range hist {
		machines = append(machines, m)
		n += len(h)
	}
	sort.Slice(machines, func(i, j int) bool { return machines[i].String() < machines[j].String() })
	written := 0
	for _, m := range machines {
		h := withClients(hist[m])
		model := claimModel(modelState{})
		res, info := porcupine.CheckOperationsVerbose(model, h, modelCheckTimeout)
		switch res {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			r.violate("item %s: the model check timed out after %v on its %d operations", m, modelCheckTimeout, len(h))
			continue
		}
		msg := fmt.Sprintf("item %s: history not linearizable against the claim model:\n%s", m, failingSubHistory(h, info))
		if logDir != "" && written < maxVisualisations {
			path := filepath.Join(logDir, fmt.Sprintf("model-%s.html", m))
			if err := porcupine.VisualizePath(model, info, path); err == nil {
				written++
				msg += "\n      visualisation: " + path
			} else {
				msg += fmt.Sprintf("\n      (visualisation not written: %v)", err)
			}
		}
		r.violate("%s", msg)
	}
	return n
}

// withClients numbers the sources of h's operations from 0, as
// porcupine's visualisation wants, and sorts h by call.
func withClients(h []porcupine.Operation) []porcupine.Operation {
	h = append([]porcupine.Operation(nil), h...)
	sort.SliceStable(h, func(i, j int) bool { return h[i].Call < h[j].Call })
	ids := map[string]int{}
	for i := range h {
		src := h[i].Metadata.(string)
		who := src[:strings.LastIndex(src, " ")] // "worker 2 op" or "db history"
		id, ok := ids[who]
		if !ok {
			id = len(ids)
			ids[who] = id
		}
		h[i].ClientId = id
	}
	return h
}

// failingSubHistory describes the smallest failing sub-history of h, a
// history porcupine found not linearizable: the longest partial
// linearization it found, from its last claim on (what came before only
// sets the state), the state it leaves, and the operations that could
// come next, none of which the model allows in that state. It checks the
// latter on their own from that state, so that what it prints fails by
// itself; if that did not fail, it prints all of h.
func failingSubHistory(h []porcupine.Operation, info porcupine.LinearizationInfo) string {
	var longest []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, l := range part {
			if len(l) > len(longest) {
				longest = l
			}
		}
	}
	state := modelState{}
	from := 0
	done := map[porcupine.Operation]bool{}
	for i, o := range longest {
		_, next := modelStep(state, o.Input, o.Output)
		state = next.(modelState)
		done[o] = true
		if k := o.Input.(modelInput).kind; k == opClaim || k == dbClaim {
			from = i
		}
	}
	var rest []porcupine.Operation
	first := int64(math.MaxInt64)
	for _, o := range h {
		if !done[o] {
			rest = append(rest, o)
			first = min(first, o.Return)
		}
	}
	var frontier []porcupine.Operation
	for _, o := range rest {
		if o.Call <= first {
			frontier = append(frontier, o)
		}
	}
	var b strings.Builder
	if len(frontier) == 0 || porcupine.CheckOperations(claimModel(state), frontier) {
		b.WriteString("      the whole history:\n")
		writeOps(&b, h, h[0].Call)
		return strings.TrimRight(b.String(), "\n")
	}
	t0 := frontier[0].Call
	if len(longest) > 0 {
		t0 = min(t0, longest[from].Call)
		b.WriteString("      linearized:\n")
		writeOps(&b, longest[from:], t0)
	}
	fmt.Fprintf(&b, "      state: %s; none of these can come next:\n", describeState(state))
	writeOps(&b, frontier, t0)
	return strings.TrimRight(b.String(), "\n")
}

func writeOps(b *strings.Builder, ops []porcupine.Operation, t0 int64) {
	for _, o := range ops {
		ret := "never returned"
		if o.Return < math.MaxInt64/4 {
			ret = fmt.Sprintf("%+.3fs", float64(o.Return-t0)/1e9)
		}
		fmt.Fprintf(b, "        [%+.3fs, %s] %s (%s)\n", float64(o.Call-t0)/1e9, ret, describeOp(o.Input, o.Output), o.Metadata)
	}
}

// stories tells a claim's sub-history, for the plain checks' violations:
// what the clients saw of it and what the database recorded, in time
// order.
type stories struct {
	ops    map[uuid.UUID][]*op
	events map[uuid.UUID][]dbEvent
	offset int64
}

func newStories(ops []*op, events []dbEvent, offset int64) *stories {
	st := &stories{ops: map[uuid.UUID][]*op{}, events: map[uuid.UUID][]dbEvent{}, offset: offset}
	for _, o := range ops {
		if o.Claim != uuid.Nil {
			st.ops[o.Claim] = append(st.ops[o.Claim], o)
		}
		for _, c := range o.Claims {
			st.ops[c.Claim] = append(st.ops[c.Claim], o)
		}
	}
	for _, e := range events {
		st.events[e.claim] = append(st.events[e.claim], e)
	}
	return st
}

// of returns claim c's sub-history, one line each, times relative to its
// first.
func (st *stories) of(c uuid.UUID) string {
	type line struct {
		at   int64
		text string
	}
	var lines []line
	for _, o := range st.ops[c] {
		ret := "never returned"
		if o.Return != 0 {
			ret = fmt.Sprintf("returned %s after %v", o.Out, time.Duration(o.Return-o.Call).Round(time.Microsecond))
		}
		lines = append(lines, line{o.Call, fmt.Sprintf("worker %d %s (op %s), %s", o.Worker, o.Kind, o.ID, ret)})
	}
	for _, e := range st.events[c] {
		lines = append(lines, line{e.at.UnixNano() - st.offset, fmt.Sprintf("database: %s history %d by session %s, token %d, at %s, committed %s",
			e.event, e.id, short(e.session), e.token, ts(e.at), ts(e.commit))})
	}
	if len(lines) == 0 {
		return ""
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
	var b strings.Builder
	fmt.Fprintf(&b, "; claim %s:", short(c))
	for _, l := range lines {
		fmt.Fprintf(&b, "\n        %+.3fs %s", float64(l.at-lines[0].at)/1e9, l.text)
	}
	return b.String()
}
