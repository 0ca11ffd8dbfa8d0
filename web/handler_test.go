package web

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline/pipelinedb"
	"github.com/bmdb-dev/bmdb/fleet"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/migrations"
)

func TestMain(m *testing.M) { os.Exit(bmdbtest.Run(m, nil)) }

// site is the pages of seeded data: 120 machines, of which busy is claimed by a live
// os-installer session for install-os, failed is in backoff for install-os,
// and done went through every stage.
type site struct {
	srv                *httptest.Server
	db                 *sql.DB
	conn               *bmdb.Connection
	busy, failed, done uuid.UUID
	sess               *bmdb.Session
}

func seed(t *testing.T) *site {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	dsn := testdb.New(t)
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "os-installer", RuntimeInfo: "host1 pid 42", SessionInterval: 10 * time.Second,
		Application: pipeline.Application()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	sess, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close(ctx) })
	q := pipelinedb.New(conn.DB())
	var ids []uuid.UUID
	if err := sess.Transact(ctx, func(tx *bmdb.Tx) error {
		var err error
		ids, err = tx.CreateMachines(ctx, 120)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f := &site{db: conn.DB(), conn: conn, sess: sess, busy: ids[117], failed: ids[118], done: ids[119]}
	for _, m := range []uuid.UUID{f.busy, f.failed, f.done} {
		if err := q.MachineProvidedInsert(ctx, pipelinedb.MachineProvidedInsertParams{MachineID: m, Provider: "dc-west"}); err != nil {
			t.Fatal(err)
		}
		if err := q.MachineAgentStartedInsert(ctx, pipelinedb.MachineAgentStartedInsertParams{MachineID: m, AgentVersion: "v7"}); err != nil {
			t.Fatal(err)
		}
	}
	one := func(id uuid.UUID) func(*bmdb.Tx) ([]uuid.UUID, error) {
		return func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{id}, nil }
	}
	if _, err := sess.Work(ctx, "install-os", one(f.busy)); err != nil {
		t.Fatal(err)
	}
	w, _ := sess.Work(ctx, "install-os", one(f.failed))
	if err := w.Fail(ctx, &bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2}, "PXE timeout"); err != nil {
		t.Fatal(err)
	}
	// done has a long history: 60 attempts, so its history pages.
	for i := range 60 {
		w, err := sess.Work(ctx, "install-os", one(f.done))
		if err != nil {
			t.Fatal(err)
		}
		if i < 59 {
			err = w.Cancel(ctx)
		} else {
			err = w.Finish(ctx, func(tx *bmdb.Tx) error {
				return pipelinedb.New(tx.DBTX()).MachineOSInstalledInsert(ctx, pipelinedb.MachineOSInstalledInsertParams{MachineID: f.done, OsImage: "debian-12"})
			})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	f.srv = httptest.NewServer(New(conn.DB(), Options{}))
	t.Cleanup(f.srv.Close)
	return f
}

// get fetches path and returns the status and body.
func (f *site) get(t *testing.T, path string, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	if len(header) == 2 {
		req.Header.Set(header[0], header[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (f *site) getJSON(t *testing.T, path string, v any) {
	t.Helper()
	status, body := f.get(t, path, "Accept", "application/json")
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, status, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, body)
	}
}

func mustContain(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q", what, w)
		}
	}
}

func TestOverview(t *testing.T) {
	f := seed(t)
	status, body := f.get(t, "/")
	if status != http.StatusOK {
		t.Fatalf("GET /: %d", status)
	}
	mustContain(t, "overview", body,
		"120 machines", `href="/machines?stage=agent-started"`, `href="/machines?process=install-os">1<`,
		`href="/machines?backoff=install-os">1<`, "PXE timeout", "os-installer", "host1 pid 42",
		`href="/session/`+f.sess.ID().String()+`"`)
	// ?format=json serves the read model (package fleet tests it).
	var o fleet.Overview
	f.getJSON(t, "/?format=json", &o)
	if o.Machines != 120 || len(o.Stages) != 4 || len(o.Sessions) != 1 || len(o.Failures) != 1 || o.Failures[0].MachineID != f.failed {
		t.Errorf("overview JSON = %+v", o)
	}
}

// The query's filters reach the list, and the next page's link keeps
// them, until the last page.
func TestMachinesFiltersAndPagination(t *testing.T) {
	f := seed(t)
	var page Machines
	f.getJSON(t, "/machines?process=install-os", &page)
	if len(page.Machines) != 1 || page.Machines[0].MachineID != f.busy || page.Next != "" {
		t.Errorf("process=install-os: %+v", page)
	}
	f.getJSON(t, "/machines?backoff=install-os&format=json", &page)
	if len(page.Machines) != 1 || page.Machines[0].MachineID != f.failed {
		t.Errorf("backoff=install-os: %+v", page)
	}
	f.getJSON(t, "/machines?stage=os-installed", &page)
	if len(page.Machines) != 1 || page.Machines[0].MachineID != f.done {
		t.Errorf("stage=os-installed: %+v", page)
	}
	// The next pages, by their cursors, cover every machine exactly once.
	seen := map[uuid.UUID]bool{}
	path, pages := "/machines", 0
	for {
		page = Machines{}
		f.getJSON(t, path, &page)
		pages++
		for _, m := range page.Machines {
			if seen[m.MachineID] {
				t.Fatalf("machine %s on two pages", m.MachineID)
			}
			seen[m.MachineID] = true
		}
		if page.Next == "" {
			break
		}
		path = "/machines?after=" + page.Next
	}
	if len(seen) != 120 || pages != 3 {
		t.Errorf("%d machines on %d pages, want 120 on 3", len(seen), pages)
	}
	_, body := f.get(t, "/machines?stage=new")
	mustContain(t, "machines page", body, `id="next"`, `href="/machines?stage=new&amp;after=`)
}

func TestMachinePage(t *testing.T) {
	f := seed(t)
	_, body := f.get(t, "/machine/"+f.busy.String())
	mustContain(t, "busy machine page", body, "agent-started", "dc-west", "v7", "install-os", "os-installer",
		`href="/session/`+f.sess.ID().String()+`"`, "alive", "Started")
	_, body = f.get(t, "/machine/"+f.failed.String())
	mustContain(t, "failed machine page", body, "PXE timeout", "in force", "1.0h", "Failed")

	// History pages: the older link's before= reaches the read, over 3
	// pages of 50.
	_, body = f.get(t, "/machine/"+f.done.String())
	pages := 1
	for {
		m := regexp.MustCompile(`<a id="older" href="(/machine/[^"]+)">`).FindStringSubmatch(body)
		if m == nil {
			break
		}
		pages++
		_, body = f.get(t, strings.ReplaceAll(m[1], "&amp;", "&"))
		if pages > 5 {
			t.Fatal("history pages do not end")
		}
	}
	history, _, _ := strings.Cut(body[strings.Index(body, `id="history"`):], "</table>")
	if n := strings.Count(history, "<tr><td>"); pages != 3 || n != 120-2*historyPerPage {
		t.Errorf("%d history pages, the last with %d rows; want 3, the last with 20", pages, n)
	}
}

func TestSessionPage(t *testing.T) {
	f := seed(t)
	_, body := f.get(t, "/session/"+f.sess.ID().String())
	mustContain(t, "session page", body, "os-installer", "host1 pid 42", "alive", f.busy.String(), "Canceled")
	var s fleet.Session
	f.getJSON(t, "/session/"+f.sess.ID().String(), &s)
	if s.Row == nil || len(s.History) != historyPerPage {
		t.Errorf("session JSON: row %v, %d events, want %d", s.Row != nil, len(s.History), historyPerPage)
	}
	// A collected session still shows its history.
	if _, err := f.db.Exec("DELETE FROM sessions WHERE session_id = $1", f.sess.ID()); err != nil {
		t.Fatal(err)
	}
	_, body = f.get(t, "/session/"+f.sess.ID().String())
	mustContain(t, "collected session page", body, "garbage-collected", "Finished")
}

func TestBadAndUnknownIDs(t *testing.T) {
	f := seed(t)
	for _, tc := range []struct {
		path   string
		status int
		want   string
	}{
		{"/machine/not-a-uuid", 400, `machine id &#34;not-a-uuid&#34; is not a UUID`},
		{"/session/1234", 400, "is not a UUID"},
		{"/machine/" + uuid.NewString(), 404, "no machine"},
		{"/session/" + uuid.NewString(), 404, "no session"},
		{"/machines?stage=flying", 400, "is not one of"},
		{"/machines?after=zzz", 400, "is not a UUID"},
		{"/machine/" + uuid.NewString() + "?before=nope", 400, "cursor"},
		// Process names follow bmdb.ValidateProcess: no white space, no
		// control characters.
		{"/machines?process=a%0Ab", 400, "control character"},
		{"/machines?process=burn%20in", 400, "white space"},
		{"/machines?backoff=a%09b", 400, "control character"},
		{"/nowhere", 404, ""},
	} {
		status, body := f.get(t, tc.path)
		if status != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %q; want %d with %q", tc.path, status, body, tc.status, tc.want)
		}
	}
	status, body := f.get(t, "/machine/nope?format=json")
	var e map[string]string
	if status != 400 || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e["error"], "not a UUID") {
		t.Errorf("JSON error: %d %s", status, body)
	}
	resp, err := http.Post(f.srv.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d, want 405 (read-only)", resp.StatusCode)
	}
}

// Links honour the mount prefix.
func TestPathPrefix(t *testing.T) {
	f := seed(t)
	mux := http.NewServeMux()
	mux.Handle("/bmdb/", http.StripPrefix("/bmdb", New(f.db, Options{PathPrefix: "/bmdb/"})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/bmdb/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !regexp.MustCompile(`href="/bmdb/machines\?stage=new"`).Match(body) {
		t.Errorf("prefixed overview: %d\n%s", resp.StatusCode, body)
	}
}

// An application with stages of its own: the pages list its stages, in its
// order, with its descriptions.
func TestCustomStages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testdb.New(t)
	app := &migrations.Application{Name: "racks", Migrations: fstest.MapFS{
		"000001_racks.up.sql": {Data: []byte(`
CREATE TABLE racked (machine_id UUID PRIMARY KEY REFERENCES machines);
CREATE VIEW app_stages AS
SELECT 'unracked'::TEXT AS stage, 1::INT8 AS position, 'waiting for a rack'::TEXT AS description
UNION ALL SELECT 'racked', 2, 'in its rack';
CREATE VIEW app_machine_stages AS
SELECT m.machine_id, CASE WHEN r.machine_id IS NULL THEN 'unracked' ELSE 'racked' END AS stage
FROM machines m LEFT JOIN racked r ON r.machine_id = m.machine_id;`)},
		"000001_racks.down.sql": {Data: []byte("DROP VIEW app_machine_stages; DROP VIEW app_stages; DROP TABLE racked;")},
	}}
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "racker", Application: app})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sess, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	var ids []uuid.UUID
	if err := sess.Transact(ctx, func(tx *bmdb.Tx) error {
		var err error
		if ids, err = tx.CreateMachines(ctx, 3); err != nil {
			return err
		}
		_, err = tx.DBTX().ExecContext(ctx, "INSERT INTO racked VALUES ($1)", ids[0])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(conn.DB(), Options{}))
	defer srv.Close()
	f := &site{srv: srv, db: conn.DB()}
	_, body := f.get(t, "/")
	mustContain(t, "overview", body, `<div class="card" title="in its rack"><a href="/machines?stage=racked"><div class="n">1</div>`,
		`href="/machines?stage=unracked"><div class="n">2</div>`)
	if strings.Index(body, "stage=unracked") > strings.Index(body, "stage=racked") {
		t.Errorf("the stages are not in the application's order")
	}
	var page Machines
	f.getJSON(t, "/machines?stage=racked", &page)
	if len(page.Machines) != 1 || page.Machines[0].MachineID != ids[0] || page.Machines[0].Stage != "racked" {
		t.Errorf("stage=racked: %+v", page)
	}
	if status, body := f.get(t, "/machines?stage=os-installed"); status != 400 || !strings.Contains(body, "unracked, racked") {
		t.Errorf("another application's stage: %d %s", status, body)
	}
}

// Without an application's stages, the pages show bmdb's generic views.
func TestNoStages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testdb.New(t)
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sess, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	var ids []uuid.UUID
	if err := sess.Transact(ctx, func(tx *bmdb.Tx) error {
		var err error
		ids, err = tx.CreateMachines(ctx, 2)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := sess.Work(ctx, "burn-in", func(*bmdb.Tx) ([]uuid.UUID, error) { return ids[:1], nil }); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(conn.DB(), Options{}))
	defer srv.Close()
	f := &site{srv: srv, db: conn.DB()}
	status, body := f.get(t, "/")
	if status != 200 {
		t.Fatalf("GET /: %d", status)
	}
	mustContain(t, "overview without stages", body, "2 machines", "defines no stages", `href="/machines?process=burn-in">1<`)
	_, body = f.get(t, "/machines?process=burn-in")
	mustContain(t, "machines without stages", body, ids[0].String())
	if strings.Contains(body, "<th>stage</th>") || strings.Contains(body, ids[1].String()) {
		t.Errorf("machines of burn-in without stages:\n%s", body)
	}
	_, body = f.get(t, "/machine/"+ids[0].String())
	mustContain(t, "machine without stages", body, "<h1>Machine <code>"+ids[0].String()+"</code></h1>", "burn-in")
	if strings.Contains(body, "<h2>Tags</h2>") {
		t.Errorf("machine without tags shows tags")
	}
	if status, body := f.get(t, "/machines?stage=new"); status != 400 || !strings.Contains(body, "defines no stages") {
		t.Errorf("stage filter without stages: %d %s", status, body)
	}
}

// expire ends the seeded session on the database clock, as a frozen
// worker's would end: its claim of busy is stuck, install-os has no live
// session.
func (f *site) expire(t *testing.T) {
	t.Helper()
	if _, err := f.db.Exec("UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1", f.sess.ID()); err != nil {
		t.Fatal(err)
	}
}

// While its worker lives, install-os has a live claim, a machine in
// backoff and no warning; provide has 117 machines pending
// (app_pending_work) and nobody who ever did it.
func TestOverviewHealth(t *testing.T) {
	f := seed(t)
	_, body := f.get(t, "/")
	mustContain(t, "overview", body, `role="alert">⚠ 117 machines wait for provide`, "none: every claim is held by a live session")
}

// A frozen worker: its session expires with a claim. The overview warns,
// lists the stuck claim with a link to its machine, and the machine list
// of the process shows the expired holder.
func TestStuckWork(t *testing.T) {
	f := seed(t)
	f.expire(t)
	_, body := f.get(t, "/")
	mustContain(t, "overview", body,
		"⚠ 2 machines wait for install-os and no live session of os-installer",
		"⚠ 1 claim held by expired sessions",
		`<tr class="stuck"><td><a href="/machine/`+f.busy.String()+`">`,
		`href="/machines?process=install-os&amp;sort=age">1<`,
		"no live sessions: no worker is running", "Expired sessions, not collected yet (1)")

	_, body = f.get(t, "/machines?process=install-os")
	mustContain(t, "machines of install-os", body, f.busy.String(), `<span class="bad">expired</span>`, `<span class="rel">`)
}

// Machine lists say who holds each machine since when, and why it is in
// backoff and for how long; sort=age lists claimed machines oldest first.
func TestMachineRows(t *testing.T) {
	f := seed(t)
	_, body := f.get(t, "/machines?backoff=install-os")
	mustContain(t, "machines in backoff", body, `install-os: <span class="bad">PXE timeout</span> <span class="rel">ends in 59 m</span>`)
	_, body = f.get(t, "/machines?process=install-os")
	mustContain(t, "machines of install-os", body, "install-os<br>", `<span class="ok">alive</span>`, `id="sort-age" href="/machines?process=install-os&amp;sort=age"`)

	// A younger claim of another process on a new machine.
	var young uuid.UUID
	if err := f.db.QueryRow("SELECT machine_id FROM machines WHERE machine_id NOT IN ($1, $2, $3) ORDER BY machine_id LIMIT 1",
		f.busy, f.failed, f.done).Scan(&young); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sess.Work(context.Background(), "provide", func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{young}, nil }); err != nil {
		t.Fatal(err)
	}
	var page Machines
	f.getJSON(t, "/machines?sort=age", &page)
	if len(page.Machines) != 2 || page.Machines[0].MachineID != f.busy || page.Machines[1].MachineID != young || page.Next != "" {
		t.Errorf("sort=age: %+v", page)
	}
	f.getJSON(t, "/machines?sort=age&process=provide", &page)
	if len(page.Machines) != 1 || page.Machines[0].MachineID != young {
		t.Errorf("sort=age&process=provide: %+v", page)
	}
	for path, want := range map[string]string{
		"/machines?sort=size":                           "is not one of",
		"/machines?sort=age&backoff=x":                  "combine it with process= only",
		"/machines?sort=age&after=nope_1":               "malformed",
		"/machines?sort=age&after=1_nope":               "is not a UUID",
		"/machines?process=" + strings.Repeat("p", 200): "process",
	} {
		if status, body := f.get(t, path); status != 400 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d %s; want 400 with %q", path, status, body, want)
		}
	}
}

// The plots: events per minute of the last hour per process, and the claim
// ages now, as inline SVG with a bar per data point.
func TestPlots(t *testing.T) {
	f := seed(t)
	_, body := f.get(t, "/")
	mustContain(t, "overview", body, `<svg class="plot events"`, `aria-label="install-os events per minute"`,
		"1 finished, 1 failed, 0 abandoned", " failed, 0 abandoned</title></rect>", `<svg class="plot ages"`,
		"1 live, 0 held by expired sessions</title></rect>", "Claim ages now (1 claim)")
	if n := strings.Count(body, `<rect class="bar"`); n != 3 {
		t.Errorf("%d bars, want 3 (a finished, a failed, a claim)", n)
	}
}

// Every page says when it was read and refreshes itself, with a pause.
func TestRefreshAndTimes(t *testing.T) {
	f := seed(t)
	for _, path := range []string{"/", "/machines", "/machine/" + f.busy.String(), "/session/" + f.sess.ID().String()} {
		_, body := f.get(t, path)
		mustContain(t, path, body, `<span id="updated" data-now="`, `<button id="pause" type="button">pause</button>`,
			`<script src="/static/bmdb.js"></script>`)
	}
	_, script := f.get(t, "/static/bmdb.js")
	mustContain(t, "the script", script, `fetch(location.href`, `document.body.dataset.refreshes`)
	_, body := f.get(t, "/machine/"+f.failed.String())
	mustContain(t, "failed machine", body, `<span class="rel">in 59 m</span>`)
	// The failure happened while seeding: "now", or seconds ago on a busy
	// machine.
	if !regexp.MustCompile(`<span class="rel">(now|\d+ s ago)</span>`).MatchString(body) {
		t.Errorf("failed machine: no relative time of its failure in\n%s", body)
	}
}

func TestRelative(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "now", 400 * time.Millisecond: "now", -3 * time.Second: "3 s ago", 2*time.Minute + 5*time.Second: "in 2 m",
		-90 * time.Minute: "1 h ago", 47 * time.Hour: "in 47 h", -72 * time.Hour: "3 d ago",
	} {
		if got := relative(d); got != want {
			t.Errorf("relative(%v) = %q, want %q", d, got, want)
		}
	}
}
