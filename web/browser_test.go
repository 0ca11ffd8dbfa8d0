package web

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// chromium returns the path of a Chromium binary, or skips the test.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("browser test skipped: no chromium on PATH (apt-get install chromium; .ci/run installs it)")
	return ""
}

// browse runs headless Chromium on url with extra flags and returns its
// stdout.
func browse(t *testing.T, bin, url string, flags ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
		"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir(),
	}, flags...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %s: %v", url, err)
	}
	return string(out)
}

// artifactDir is where screenshots go: $BMDB_ARTIFACT_DIR, or a fixed
// directory under the system temp dir so that a person can look at them.
func artifactDir(t *testing.T) string {
	dir := os.Getenv("BMDB_ARTIFACT_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "bmdb-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// text strips tags from a DOM dump, leaving what a person reads.
func text(dom string) string {
	s := regexp.MustCompile(`(?s)<style.*?</style>|<[^>]+>`).ReplaceAllString(dom, " ")
	return strings.Join(strings.Fields(s), " ")
}

// End to end: a real browser renders the pages served on a real socket,
// follows the overview's links, and what it shows matches the database.
func TestBrowser(t *testing.T) {
	bin := chromium(t)
	f := seed(t)

	overview := text(browse(t, bin, f.srv.URL+"/", "--dump-dom"))
	for _, want := range []string{"Fleet overview: 120 machines", "117 new", "2 agent-started", "1 os-installed",
		"install-os 1", "os-installer", "PXE timeout"} {
		if !strings.Contains(overview, want) {
			t.Errorf("overview as rendered lacks %q:\n%s", want, overview)
		}
	}

	// Follow the backoff count's link to the list, and the list to the machine.
	list := browse(t, bin, f.srv.URL+"/machines?backoff=install-os", "--dump-dom")
	link := regexp.MustCompile(`href="(/machine/[0-9a-f-]{36})"`).FindStringSubmatch(list)
	if link == nil || !strings.Contains(link[1], f.failed.String()) {
		t.Fatalf("backoff list does not link the failed machine:\n%s", text(list))
	}
	machine := text(browse(t, bin, f.srv.URL+link[1], "--dump-dom"))
	for _, want := range []string{"Machine " + f.failed.String(), ": agent-started", "dc-west", "PXE timeout", "in force", "Failed"} {
		if !strings.Contains(machine, want) {
			t.Errorf("machine page as rendered lacks %q:\n%s", want, machine)
		}
	}

	dir := artifactDir(t)
	for name, path := range map[string]string{
		"overview.png": "/",
		"machine.png":  "/machine/" + f.busy.String(),
	} {
		shot := filepath.Join(dir, name)
		os.Remove(shot)
		browse(t, bin, f.srv.URL+path, "--screenshot="+shot, "--window-size=1280,1100", "--hide-scrollbars")
		if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
			t.Errorf("screenshot %s missing or empty: %v", shot, err)
		} else {
			t.Logf("screenshot of %s: %s", path, shot)
		}
	}
}

// A frozen worker, as an operator meets it in a browser: its session has
// expired with a claim. The overview warns and shows the stuck claim, one
// click reaches the machine, the plots render with data, and the page
// refreshes itself.
func TestBrowserStuckWork(t *testing.T) {
	bin := chromium(t)
	f := seed(t)
	f.expire(t)
	var overviews atomic.Int64 // requests of the overview: the refreshes
	pages := New(f.db, Options{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			overviews.Add(1)
		}
		pages.ServeHTTP(w, r)
	}))
	defer srv.Close()

	// Virtual time lets the refresh timer fire twice within the dump.
	dom := browse(t, bin, srv.URL+"/", "--dump-dom", "--virtual-time-budget=12000")
	overview := text(dom)
	for _, want := range []string{"⚠ 2 machines wait for install-os and no live session of os-installer",
		"⚠ 1 claim held by expired sessions", "Claims held by expired sessions (1)", "no live sessions: no worker is running"} {
		if !strings.Contains(overview, want) {
			t.Errorf("overview as rendered lacks %q:\n%s", want, overview)
		}
	}
	m := regexp.MustCompile(`data-refreshes="(\d+)"`).FindStringSubmatch(dom)
	if m == nil || m[1] == "0" || overviews.Load() < 2 {
		t.Errorf("the overview did not refresh itself: body %v, %d requests of /", m, overviews.Load())
	}
	if !regexp.MustCompile(`<svg class="plot events"[^>]*>.*<rect class="bar"`).MatchString(dom) ||
		!regexp.MustCompile(`<svg class="plot ages"[^>]*>.*<rect class="bar"`).MatchString(dom) {
		t.Errorf("the plots have no bars:\n%s", dom)
	}

	// One click: the stuck claim's row links its machine.
	link := regexp.MustCompile(`<tr class="stuck"><td><a href="(/machine/[0-9a-f-]{36})"`).FindStringSubmatch(dom)
	if link == nil || link[1] != "/machine/"+f.busy.String() {
		t.Fatalf("the stuck claim does not link its machine: %v", link)
	}
	machine := text(browse(t, bin, srv.URL+link[1], "--dump-dom"))
	for _, want := range []string{"Machine " + f.busy.String(), "install-os", "os-installer", "expired"} {
		if !strings.Contains(machine, want) {
			t.Errorf("machine page as rendered lacks %q:\n%s", want, machine)
		}
	}
	list := text(browse(t, bin, srv.URL+"/machines?process=install-os", "--dump-dom"))
	if !strings.Contains(list, f.busy.String()) || !strings.Contains(list, "expired") {
		t.Errorf("/machines?process=install-os lacks the expired holder:\n%s", list)
	}

	dir := artifactDir(t)
	for name, path := range map[string]string{
		"stuck-overview.png": "/",
		"stuck-machines.png": "/machines?process=install-os",
	} {
		shot := filepath.Join(dir, name)
		os.Remove(shot)
		browse(t, bin, srv.URL+path, "--screenshot="+shot, "--window-size=1280,1600", "--hide-scrollbars")
		if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
			t.Errorf("screenshot %s missing or empty: %v", shot, err)
		} else {
			t.Logf("screenshot of %s: %s", path, shot)
		}
	}
}

// An idle fleet in a browser: no live session, one machine taken over,
// one whose claim went with its expired session, one whose backoff is
// over. The overview is not red where nothing waits; the machine page
// says why a claim was abandoned and lists the past backoff as history.
func TestBrowserIdleFleet(t *testing.T) {
	bin := chromium(t)
	h := seedHistory(t)

	overview := text(browse(t, bin, h.srv.URL+"/", "--dump-dom"))
	for _, want := range []string{"burn-in", "memtest", "no live sessions"} {
		if !strings.Contains(overview, want) {
			t.Errorf("idle overview as rendered lacks %q:\n%s", want, overview)
		}
	}
	taken := text(browse(t, bin, h.srv.URL+"/machine/"+h.takenOver.String(), "--dump-dom"))
	if want := "taken over by session " + h.taker.String()[:8] + " (burner)"; !strings.Contains(taken, want) {
		t.Errorf("machine page as rendered lacks %q:\n%s", want, taken)
	}
	backedOff := text(browse(t, bin, h.srv.URL+"/machine/"+h.backedOff.String(), "--dump-dom"))
	if !strings.Contains(backedOff, "Backoffs in force process until interval cause none") || !strings.Contains(backedOff, "Past backoffs") {
		t.Errorf("machine page as rendered shows the backoff that is over as in force:\n%s", backedOff)
	}

	dir := artifactDir(t)
	for name, path := range map[string]string{
		"idle-overview.png": "/",
		"idle-machine.png":  "/machine/" + h.takenOver.String(),
		"past-backoffs.png": "/machine/" + h.backedOff.String(),
	} {
		shot := filepath.Join(dir, name)
		os.Remove(shot)
		browse(t, bin, h.srv.URL+path, "--screenshot="+shot, "--window-size=1280,1100", "--hide-scrollbars")
		if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
			t.Errorf("screenshot %s missing or empty: %v", shot, err)
		} else {
			t.Logf("screenshot of %s: %s", path, shot)
		}
	}
}
