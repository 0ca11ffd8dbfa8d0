package web

import (
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// operatorToken is the tests' operator credential.
const operatorToken = "alice-secret-token-0123456789"

// withActions serves f's database with actions for operator alice.
func (f *site) withActions(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(New(f.db, Options{Actions: &Actions{Conn: f.conn, Operators: map[string]string{operatorToken: "alice"}}}))
	t.Cleanup(srv.Close)
	return srv
}

// client is an HTTP client with a cookie jar that does not follow
// redirects.
func client(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func post(t *testing.T, c *http.Client, target string, form url.Values, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func getWith(t *testing.T, c *http.Client, target string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(target)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

// count runs a count query on the fleet's database.
func (f *site) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// Every response, pages, errors and assets, read-only or not, forbids
// framing and sniffing, and allows no script and no style but the
// handler's own: no inline ones.
func TestSecurityHeaders(t *testing.T) {
	f := seed(t)
	for _, srv := range []*httptest.Server{f.srv, f.withActions(t)} {
		for _, path := range []string{"/", "/machines", "/machine/" + f.busy.String(), "/machine/not-a-uuid", "/nowhere", "/static/bmdb.js", "/?format=json"} {
			_, _, h := getWith(t, client(t), srv.URL+path)
			csp := h.Get("Content-Security-Policy")
			if !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "style-src 'self';") ||
				strings.Contains(csp, "unsafe-eval") || strings.Contains(csp, "unsafe-inline") {
				t.Errorf("%s: Content-Security-Policy %q", path, csp)
			}
			if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Frame-Options") != "DENY" {
				t.Errorf("%s: headers %v", path, h)
			}
		}
	}
}

// Without Actions, nothing acts: no sign-in page, no action endpoint, no
// form, whatever is posted.
func TestReadOnlyWithoutActions(t *testing.T) {
	f := seed(t)
	c := client(t)
	if status, _, _ := getWith(t, c, f.srv.URL+"/login"); status != http.StatusNotFound {
		t.Errorf("GET /login = %d, want 404", status)
	}
	for _, action := range []string{"pause", "resume", "cap", "clear-backoff"} {
		status, _ := post(t, c, f.srv.URL+"/action/"+action, url.Values{"process": {"install-os"}, "cap": {"1"}, "machine": {f.failed.String()}})
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			t.Errorf("POST /action/%s on read-only pages = %d", action, status)
		}
	}
	if status, _ := post(t, c, f.srv.URL+"/login", url.Values{"token": {operatorToken}}); status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
		t.Errorf("POST /login on read-only pages = %d", status)
	}
	_, body, _ := getWith(t, c, f.srv.URL+"/")
	if strings.Contains(body, "<form method=\"post\"") || strings.Contains(body, "sign-in") {
		t.Errorf("read-only overview offers a form or a sign-in")
	}
	if n := f.count(t, "SELECT count(*) FROM process_control_history"); n != 0 {
		t.Errorf("%d control changes recorded", n)
	}
}

// With Actions: a crafted POST without a signed-in operator, with a wrong
// token, with a stale CSRF token or from another origin is refused; a
// signed-in operator's pause, cap and backoff clear take effect and are
// recorded with their name; sign-out ends it.
func TestActionsNeedAnOperator(t *testing.T) {
	f := seed(t)
	srv := f.withActions(t)
	anon := client(t)
	pause := url.Values{"process": {"install-os"}, "reason": {"crafted"}}
	if status, _ := post(t, anon, srv.URL+"/action/pause", pause); status != http.StatusForbidden {
		t.Errorf("POST /action/pause without signing in = %d, want 403", status)
	}
	if status, body := post(t, anon, srv.URL+"/login", url.Values{"token": {"not-the-token-at-all"}}); status != http.StatusForbidden || !strings.Contains(body, "not an operator") {
		t.Errorf("sign-in with a wrong token = %d", status)
	}

	op := client(t)
	status, _ := post(t, op, srv.URL+"/login", url.Values{"token": {operatorToken}})
	if status != http.StatusSeeOther {
		t.Fatalf("sign-in = %d, want 303", status)
	}
	u, _ := url.Parse(srv.URL)
	cookies := op.Jar.Cookies(u)
	if len(cookies) != 1 || cookies[0].Name != cookieName {
		t.Fatalf("cookies after sign-in: %v", cookies)
	}
	_, body, _ := getWith(t, op, srv.URL+"/")
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`).FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, `operator <strong id="operator">alice</strong>`) {
		t.Fatalf("signed-in overview has no CSRF token or operator:\n%s", body)
	}
	csrf := m[1]
	with := func(v url.Values, kv ...string) url.Values {
		out := url.Values{}
		for k, vs := range v {
			out[k] = vs
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	// The token with its first digit changed (to 0, or to 1 if it was 0:
	// one token in 16 begins with 0).
	wrong := "0" + csrf[1:]
	if wrong == csrf {
		wrong = "1" + csrf[1:]
	}
	if status, _ := post(t, op, srv.URL+"/action/pause", with(pause, "csrf", wrong)); status != http.StatusForbidden {
		t.Errorf("pause with a wrong CSRF token = %d, want 403", status)
	}
	if status, _ := post(t, op, srv.URL+"/action/pause", with(pause, "csrf", csrf), "Origin", "https://evil.example"); status != http.StatusForbidden {
		t.Errorf("pause from another origin = %d, want 403", status)
	}
	if n := f.count(t, "SELECT count(*) FROM process_control_history"); n != 0 {
		t.Fatalf("%d changes recorded by refused actions", n)
	}

	if status, _ := post(t, op, srv.URL+"/action/pause", with(pause, "csrf", csrf, "reason", "bad image"), "Origin", srv.URL); status != http.StatusSeeOther {
		t.Fatalf("pause = %d, want 303", status)
	}
	_, body, _ = getWith(t, op, srv.URL+"/")
	if !strings.Contains(body, "install-os is now paused") || !strings.Contains(body, `<p class="paused" role="alert">`) {
		t.Errorf("overview after the pause lacks the outcome or the banner")
	}
	if status, _ := post(t, op, srv.URL+"/action/cap", url.Values{"csrf": {csrf}, "process": {"install-os"}, "cap": {"0"}}); status != http.StatusBadRequest {
		t.Errorf("cap 0 = %d, want 400", status)
	}
	if status, _ := post(t, op, srv.URL+"/action/cap", url.Values{"csrf": {csrf}, "process": {"burn in"}, "cap": {"3"}, "new": {"1"}}); status != http.StatusBadRequest {
		t.Errorf("cap of a bad process name = %d, want 400", status)
	}
	// burn-in has not run yet: a new process.
	if status, _ := post(t, op, srv.URL+"/action/cap", url.Values{"csrf": {csrf}, "process": {"burn-in"}, "cap": {"3"}, "new": {"1"}}); status != http.StatusSeeOther {
		t.Errorf("cap = %d, want 303", status)
	}
	back := "/machine/" + f.failed.String()
	status, _ = post(t, op, srv.URL+"/action/clear-backoff", url.Values{"csrf": {csrf}, "process": {"install-os"}, "machine": {f.failed.String()}, "reason": {"PXE fixed"}, "back": {back}})
	if status != http.StatusSeeOther {
		t.Errorf("clear-backoff = %d, want 303", status)
	}
	var who string
	if err := f.db.QueryRow(`SELECT string_agg(process || ':' || action || ':' || actor || ':' || reason, ' ' ORDER BY id) FROM process_control_history`).Scan(&who); err != nil {
		t.Fatal(err)
	}
	if who != "install-os:pause:alice:bad image burn-in:cap:alice:" {
		t.Errorf("recorded changes %q", who)
	}
	if n := f.count(t, "SELECT count(*) FROM work_history WHERE event = 'BackoffCleared' AND failed_cause = 'alice: PXE fixed'"); n != 1 {
		t.Errorf("the cleared backoff is not recorded with the operator's name")
	}
	if status, _ := post(t, op, srv.URL+"/logout", url.Values{"csrf": {csrf}}); status != http.StatusSeeOther {
		t.Errorf("sign-out = %d", status)
	}
	if status, _ := post(t, op, srv.URL+"/action/resume", url.Values{"csrf": {csrf}, "process": {"install-os"}}); status != http.StatusForbidden {
		t.Errorf("resume after sign-out = %d, want 403", status)
	}
}

func TestParseOperators(t *testing.T) {
	ops, err := ParseOperators("# operators\nalice:" + operatorToken + "\n\nbob:bob-token-0123456789abcdef, carol : carol-token-0123456789ab\n")
	if err != nil || len(ops) != 3 || ops[operatorToken] != "alice" || ops["bob-token-0123456789abcdef"] != "bob" || ops["carol-token-0123456789ab"] != "carol" {
		t.Fatalf("ParseOperators = %v, %v", ops, err)
	}
	for _, bad := range []string{"", "# none", "alice", "alice:short", ":" + operatorToken, "alice:" + operatorToken + ",alice:other-token-0123456789",
		"alice:" + operatorToken + ",bob:" + operatorToken, "al\x01ice:" + operatorToken} {
		_, err := ParseOperators(bad)
		if !errors.Is(err, ErrBadOperators) {
			t.Errorf("ParseOperators(%q) = %v, want ErrBadOperators", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), operatorToken) {
			t.Errorf("ParseOperators(%q): the error shows a token: %v", bad, err)
		}
	}
}

// signIn signs operator alice in on srv and returns her client and the
// session's CSRF token.
func signIn(t *testing.T, srv *httptest.Server) (*http.Client, string) {
	t.Helper()
	op := client(t)
	if status, _ := post(t, op, srv.URL+"/login", url.Values{"token": {operatorToken}}); status != http.StatusSeeOther {
		t.Fatalf("sign-in = %d, want 303", status)
	}
	_, body, _ := getWith(t, op, srv.URL+"/")
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("signed-in overview has no CSRF token:\n%s", body)
	}
	return op, m[1]
}

// A pause, resume or cap of a process the database does not know is
// refused as bmdbctl refuses it, naming the known processes and the
// nearest, unless the form says it is a new process.
func TestActionsRefuseUnknownProcess(t *testing.T) {
	f := seed(t)
	srv := f.withActions(t)
	op, csrf := signIn(t, srv)
	for _, tc := range []struct{ action, process, want string }{
		{"pause", "nosuchprocess", `process &#34;nosuchprocess&#34; is unknown (no claims, history, backoffs or controls yet); known processes: install-os; tick “new process” to pause it anyway`},
		{"resume", "install_os", `did you mean &#34;install-os&#34;? known processes: install-os; tick “new process” to resume it anyway`},
		{"cap", "instal-os", `did you mean &#34;install-os&#34;?`},
	} {
		status, body := post(t, op, srv.URL+"/action/"+tc.action, url.Values{"csrf": {csrf}, "process": {tc.process}, "cap": {"2"}})
		if status != http.StatusBadRequest || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s = %d; want 400 with %q in\n%s", tc.action, tc.process, status, tc.want, body)
		}
	}
	if n := f.count(t, "SELECT count(*) FROM process_controls WHERE process <> 'install-os'"); n != 0 {
		t.Errorf("refused actions made %d controls rows", n)
	}
	// The overview's form for a process not listed has the box.
	_, body, _ := getWith(t, op, srv.URL+"/")
	if !strings.Contains(body, `<input type="checkbox" name="new" value="1"> new process</label>`) {
		t.Errorf("the overview's new-process form lacks its box")
	}
	if status, _ := post(t, op, srv.URL+"/action/pause", url.Values{"csrf": {csrf}, "process": {"firmware"}, "new": {"1"}}); status != http.StatusSeeOther {
		t.Errorf("pause of a new process, so said = %d, want 303", status)
	}
	if n := f.count(t, "SELECT count(*) FROM process_controls WHERE process = 'firmware' AND paused"); n != 1 {
		t.Errorf("the new process is not paused")
	}
}

// Delete controls: the button on each process's row; a paused or capped
// process's controls only when the form says to lift them.
func TestDeleteControlsAction(t *testing.T) {
	f := seed(t)
	srv := f.withActions(t)
	op, csrf := signIn(t, srv)
	_, body, _ := getWith(t, op, srv.URL+"/")
	row, _, _ := strings.Cut(body[strings.Index(body, `<tr data-process="install-os">`):], "</tr>")
	if !strings.Contains(row, `action="/action/delete"`) || !strings.Contains(row, `name="csrf" value="`+csrf+`"`) || strings.Contains(row, `name="lift"`) {
		t.Errorf("install-os's row, running: no delete form with the CSRF token, or a lift box:\n%s", row)
	}
	if status, _ := post(t, op, srv.URL+"/action/pause", url.Values{"csrf": {csrf}, "process": {"install-os"}}); status != http.StatusSeeOther {
		t.Fatalf("pause = %d", status)
	}
	_, body, _ = getWith(t, op, srv.URL+"/")
	row, _, _ = strings.Cut(body[strings.Index(body, `<tr class="stuck" data-process="install-os">`):], "</tr>")
	if !strings.Contains(row, `<input type="checkbox" name="lift" value="1"> lift</label>`) {
		t.Errorf("install-os's row, paused: no lift box:\n%s", row)
	}
	status, body := post(t, op, srv.URL+"/action/delete", url.Values{"csrf": {csrf}, "process": {"install-os"}, "reason": {"retired"}})
	if want := "install-os is paused: deleting its controls lifts that; tick “lift” to delete them anyway"; status != http.StatusBadRequest || !strings.Contains(body, want) {
		t.Errorf("delete of a paused process without lift = %d; want 400 with %q", status, want)
	}
	if n := f.count(t, "SELECT count(*) FROM process_controls WHERE process = 'install-os'"); n != 1 {
		t.Fatalf("the refused delete deleted")
	}
	if status, _ := post(t, op, srv.URL+"/action/delete", url.Values{"csrf": {csrf}, "process": {"install-os"}, "reason": {"retired"}, "lift": {"1"}}); status != http.StatusSeeOther {
		t.Fatalf("delete with lift = %d, want 303", status)
	}
	_, body, _ = getWith(t, op, srv.URL+"/")
	if !strings.Contains(body, "the controls of install-os are deleted") || strings.Contains(body, `data-process="install-os"`) {
		t.Errorf("the overview after the delete lacks its outcome or still lists install-os")
	}
	if n := f.count(t, "SELECT count(*) FROM process_control_history WHERE process = 'install-os' AND action = 'delete' AND actor = 'alice' AND reason = 'retired'"); n != 1 {
		t.Errorf("the delete is not recorded")
	}
	if status, body := post(t, op, srv.URL+"/action/delete", url.Values{"csrf": {csrf}, "process": {"install-os"}}); status != http.StatusSeeOther {
		t.Errorf("delete again = %d %s", status, body)
	}
	_, body, _ = getWith(t, op, srv.URL+"/")
	if !strings.Contains(body, "install-os had no controls: nothing changed") {
		t.Errorf("the second delete does not say it changed nothing")
	}
}

// No served page has a style attribute or element: the policy allows
// none (no 'unsafe-inline').
func TestNoInlineStyles(t *testing.T) {
	f := seed(t)
	srv := f.withActions(t)
	signedOut := client(t)
	op, _ := signIn(t, srv)
	if status, _ := post(t, op, srv.URL+"/action/cap", url.Values{"csrf": {mustCSRF(t, op, srv)}, "process": {"install-os"}, "cap": {"2"}}); status != http.StatusSeeOther {
		t.Fatalf("cap = %d", status) // a capped process's row has the most forms
	}
	inline := regexp.MustCompile(`(?i)<style|\sstyle\s*=`)
	pages := []string{"/", "/machines", "/machines?sort=age", "/machine/" + f.busy.String(), "/machine/" + f.failed.String(),
		"/session/" + f.sess.ID().String(), "/login", "/nowhere", "/machine/nope"}
	for _, c := range []*http.Client{signedOut, op} {
		for _, path := range pages {
			_, body, _ := getWith(t, c, srv.URL+path)
			if m := inline.FindString(body); m != "" {
				i := strings.Index(body, m)
				t.Errorf("%s has inline style %q: …%s…", path, m, body[max(0, i-80):min(len(body), i+80)])
			}
		}
	}
}

// mustCSRF returns the CSRF token of op's overview.
func mustCSRF(t *testing.T, op *http.Client, srv *httptest.Server) string {
	t.Helper()
	_, body, _ := getWith(t, op, srv.URL+"/")
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token")
	}
	return m[1]
}
