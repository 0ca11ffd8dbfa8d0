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
// framing and sniffing, and allows no script but the handler's own.
func TestSecurityHeaders(t *testing.T) {
	f := seed(t)
	for _, srv := range []*httptest.Server{f.srv, f.withActions(t)} {
		for _, path := range []string{"/", "/machines", "/machine/" + f.busy.String(), "/machine/not-a-uuid", "/nowhere", "/static/bmdb.js", "/?format=json"} {
			_, _, h := getWith(t, client(t), srv.URL+path)
			csp := h.Get("Content-Security-Policy")
			if !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-eval") {
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
	if status, _ := post(t, op, srv.URL+"/action/cap", url.Values{"csrf": {csrf}, "process": {"burn-in"}, "cap": {"0"}}); status != http.StatusBadRequest {
		t.Errorf("cap 0 = %d, want 400", status)
	}
	if status, _ := post(t, op, srv.URL+"/action/cap", url.Values{"csrf": {csrf}, "process": {"burn in"}, "cap": {"3"}}); status != http.StatusBadRequest {
		t.Errorf("cap of a bad process name = %d, want 400", status)
	}
	if status, _ := post(t, op, srv.URL+"/action/cap", url.Values{"csrf": {csrf}, "process": {"burn-in"}, "cap": {"3"}}); status != http.StatusSeeOther {
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
