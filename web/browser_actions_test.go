package web

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// driven starts headless Chromium driven over the DevTools protocol, for
// tests that click; it is closed at cleanup.
func driven(t *testing.T, bin string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1400))
	// A profile of its own, removed once the browser is gone (it writes
	// there while it exits, which t.TempDir's cleanup would not wait for).
	profile, err := os.MkdirTemp("", "bmdb-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, chromedp.UserDataDir(profile))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc() // waits for the browser to exit
		_ = os.RemoveAll(profile)
	})
	return ctx
}

// watchCSP collects the Content-Security-Policy violations of the pages
// b loads from now on: the browser's own console errors about the policy,
// and each securitypolicyviolation event, which a script the browser runs
// before each page's own (exempt from the policy) reports.
func watchCSP(t *testing.T, b context.Context) func() []string {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	add := func(s string) {
		mu.Lock()
		seen = append(seen, s)
		mu.Unlock()
	}
	chromedp.ListenTarget(b, func(ev any) {
		switch ev := ev.(type) {
		case *cdplog.EventEntryAdded:
			if strings.Contains(ev.Entry.Text, "Content Security Policy") {
				add("console: " + ev.Entry.Text)
			}
		case *runtime.EventConsoleAPICalled:
			for _, a := range ev.Args {
				if strings.Contains(string(a.Value), "CSP violation") {
					add("event: " + string(a.Value))
				}
			}
		}
	})
	err := chromedp.Run(b, chromedp.ActionFunc(func(ctx context.Context) error {
		_, err := page.AddScriptToEvaluateOnNewDocument(`document.addEventListener("securitypolicyviolation",
			e => console.error("CSP violation: " + e.violatedDirective + " " + e.blockedURI))`).Do(ctx)
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// An operator in a real browser. Signed out, the overview offers no
// action, and neither a crafted POST from the page nor a form another site
// submits changes anything. Signed in with the token, the operator pauses
// one process and caps another with the overview's buttons: both take
// effect, are recorded with their name, and the overview shows them (a
// banner for the pause); the screenshot shows it.
func TestBrowserOperatorActions(t *testing.T) {
	bin := chromium(t)
	f := seed(t)
	ctx := context.Background()
	// A second process, with a claim, for the cap.
	var extra uuid.UUID
	if err := f.sess.Transact(ctx, func(tx *bmdb.Tx) error {
		ids, err := tx.CreateMachines(ctx, 1)
		extra = ids[0]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sess.Work(ctx, "burn-in", func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{extra}, nil }); err != nil {
		t.Fatal(err)
	}
	srv := f.withActions(t)
	// Another site, which submits a form to the pages as soon as it loads.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form method="post" action="%s/action/pause"><input name="process" value="burn-in"><input name="csrf" value="guess"></form>
<script>document.forms[0].submit()</script>`, srv.URL)
	}))
	defer evil.Close()
	b := driven(t, bin)
	violations := watchCSP(t, b)

	var forms int
	var crafted int
	err := chromedp.Run(b,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible("#sign-in"),
		chromedp.Evaluate(`document.querySelectorAll("form[action*='/action/']").length`, &forms),
		chromedp.Evaluate(`fetch("/action/pause", {method: "POST", body: new URLSearchParams({process: "install-os", reason: "crafted"})}).then(r => r.status)`, &crafted,
			func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }),
	)
	if err != nil {
		t.Fatal(err)
	}
	if forms != 0 || crafted != http.StatusForbidden {
		t.Errorf("signed out: %d action forms, a crafted POST got %d; want none and 403", forms, crafted)
	}

	var operator, flash string
	err = chromedp.Run(b,
		chromedp.Navigate(srv.URL+"/login"),
		chromedp.SendKeys(`input[name=token]`, operatorToken),
		chromedp.Click(`#login button`),
		chromedp.WaitVisible("#operator"),
		chromedp.Text("#operator", &operator),
		// Another site's form, with the operator signed in here.
		chromedp.Navigate(evil.URL+"/"),
		chromedp.Sleep(500*time.Millisecond), // the form is submitted on load; nothing should come of it
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`tr[data-process="install-os"] input[name=reason]`),
		chromedp.SendKeys(`tr[data-process="install-os"] input[name=reason]`, "bad image"),
		chromedp.Click(`tr[data-process="install-os"] button[value=pause]`),
		chromedp.WaitVisible(`p.paused`),
		chromedp.SendKeys(`tr[data-process="burn-in"] input[name=cap]`, "2"),
		chromedp.Click(`tr[data-process="burn-in"] button[value=cap]`),
		// Only a capped process's row offers to remove its cap: the page
		// the cap's POST returns to.
		chromedp.WaitVisible(`tr[data-process="burn-in"] form.uncap button`),
		chromedp.Text(`#flash`, &flash),
	)
	if err != nil {
		t.Fatal(err)
	}
	if operator != "alice" || flash != "burn-in is now capped at 2 live claims" {
		t.Errorf("signed in as %q, the cap said %q", operator, flash)
	}
	var changes string
	if err := f.db.QueryRow(`SELECT string_agg(process || ':' || action || ':' || COALESCE(claim_cap::text, '-') || ':' || actor || ':' || reason, ' ' ORDER BY id)
		FROM process_control_history`).Scan(&changes); err != nil {
		t.Fatal(err)
	}
	if changes != "install-os:pause:-:alice:bad image burn-in:cap:2:alice:" {
		t.Errorf("recorded changes %q; want the pause and the cap by alice, and nothing from the crafted POST or the other site", changes)
	}
	var banner, controls string
	var png []byte
	err = chromedp.Run(b,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`p.paused`),
		chromedp.Text(`p.paused`, &banner),
		chromedp.Text(`#process-controls`, &controls),
		chromedp.FullScreenshot(&png, 100),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(banner, "install-os is paused fleet-wide") || !strings.Contains(banner, "alice: bad image") {
		t.Errorf("pause banner %q", banner)
	}
	if !strings.Contains(controls, "burn-in") || !strings.Contains(controls, "paused") {
		t.Errorf("controls table %q", controls)
	}
	shot := filepath.Join(artifactDir(t), "fleet-controls.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil || len(png) < 10_000 {
		t.Errorf("screenshot %s: %d bytes, %v", shot, len(png), err)
	} else {
		t.Logf("screenshot of the overview with a paused and a capped process: %s", shot)
	}

	// Remove cap posts its own form: the cap field of the Set cap form,
	// empty, must not ride along and make the request a bad one.
	err = chromedp.Run(b,
		chromedp.Click(`tr[data-process="burn-in"] form.uncap button`),
		chromedp.WaitNotPresent(`tr[data-process="burn-in"] form.uncap`),
		chromedp.Text(`#flash`, &flash),
	)
	if err != nil {
		t.Fatal(err)
	}
	if flash != "burn-in is now without a cap" {
		t.Errorf("Remove cap said %q, want the cap removed", flash)
	}
	var last string
	if err := f.db.QueryRow(`SELECT process || ':' || action || ':' || COALESCE(claim_cap::text, '-') || ':' || actor
		FROM process_control_history ORDER BY id DESC LIMIT 1`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(last, "burn-in:") || !strings.HasSuffix(last, ":-:alice") {
		t.Errorf("last recorded change %q, want burn-in's cap removed by alice", last)
	}

	// No page broke the policy (the other site's page has none), and a
	// style attribute would have: the policy refuses inline styles, and
	// the watch sees it.
	if v := violations(); len(v) != 0 {
		t.Errorf("Content-Security-Policy violations on the pages: %q", v)
	}
	err = chromedp.Run(b,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible("#operator"),
		chromedp.Evaluate(`document.body.insertAdjacentHTML("beforeend", '<p id="styled" style="color: red">x</p>')`, nil),
	)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(violations()) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if v := violations(); len(v) == 0 || !strings.Contains(strings.Join(v, " "), "style-src") {
		t.Errorf("an inline style attribute was not reported as a violation of style-src: %q", v)
	} else {
		t.Logf("a deliberate inline style is refused: %s", v[0])
	}
}
