package web

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/fleet"
)

// Actions enables the pages' action buttons for operators who sign in with
// a token: pause and resume a process, cap it, delete its controls, clear
// a backoff. Each action runs in a session of its own on Conn and is
// recorded with the operator's name (process_control_history; a cleared
// backoff's cause). Without Actions the pages are read-only: the sign-in
// page and the action endpoints do not exist.
//
// As bmdbctl does, the pages refuse to pause, resume or cap a process the
// database does not know (fleet.CheckProcessKnown: most likely a typo)
// unless the form says it is a new process (its "new process" box), and
// to delete the controls of a paused or capped process unless the form
// says to lift them (its "lift" box).
//
// An operator signs in at /login with their token (compared in constant
// time); the handler then keeps a session for them, in memory, for
// ActionSessionLifetime, in an HttpOnly, SameSite=Strict cookie. Every
// action is a POST carrying the session's CSRF token and, if the browser
// sends one, an Origin of the handler's own host; anything else is refused
// (403).
type Actions struct {
	// Conn runs the actions. It must stay open while the handler serves.
	Conn *bmdb.Connection
	// Operators maps each operator's token to their name (ParseOperators).
	Operators map[string]string
}

// ActionSessionLifetime is how long an operator stays signed in.
const ActionSessionLifetime = 12 * time.Hour

// ErrBadOperators is wrapped by ParseOperators' errors.
var ErrBadOperators = errors.New("web: bad operator credentials")

// minTokenLength is the shortest token ParseOperators accepts.
const minTokenLength = 16

// ParseOperators parses operator credentials, NAME:TOKEN entries one per
// line or separated by commas (blank lines and lines starting with # are
// skipped), as kept in a file or an environment variable, into
// Actions.Operators. A name is 1 to 64 printable characters without ':'
// or ','; a token at least 16 characters without blanks; both unique.
// Errors wrap ErrBadOperators and name the entry by number, never its
// token.
func ParseOperators(s string) (map[string]string, error) {
	ops := map[string]string{}
	names := map[string]bool{}
	n := 0
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, entry := range strings.Split(line, ",") {
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			n++
			name, token, ok := strings.Cut(entry, ":")
			name, token = strings.TrimSpace(name), strings.TrimSpace(token)
			switch {
			case !ok:
				return nil, fmt.Errorf("%w: entry %d is not NAME:TOKEN", ErrBadOperators, n)
			case name == "" || len(name) > 64 || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
				return nil, fmt.Errorf("%w: entry %d: the name must be 1 to 64 printable characters", ErrBadOperators, n)
			case len(token) < minTokenLength || strings.IndexFunc(token, unicode.IsSpace) >= 0:
				return nil, fmt.Errorf("%w: entry %d (%s): the token must be at least %d characters, without blanks", ErrBadOperators, n, name, minTokenLength)
			case names[name]:
				return nil, fmt.Errorf("%w: entry %d: the name %s is given twice", ErrBadOperators, n, name)
			case ops[token] != "":
				return nil, fmt.Errorf("%w: entry %d (%s): its token is another operator's too", ErrBadOperators, n, name)
			}
			names[name], ops[token] = true, name
		}
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("%w: no NAME:TOKEN entry", ErrBadOperators)
	}
	return ops, nil
}

// operators are a Handler's signed-in operators. Safe for concurrent use.
type operators struct {
	actions *Actions
	hashes  map[[sha256.Size]byte]string // sha256 of each token, to compare in constant time

	mu       sync.Mutex
	sessions map[string]*operatorSession // guarded by mu; by cookie value
}

// operatorSession is a signed-in operator. Immutable but for flash.
type operatorSession struct {
	Name    string
	CSRF    string // the token every action form carries
	expires time.Time
	flash   string // guarded by operators.mu: the outcome of the last action, shown once
}

func newOperators(a *Actions) *operators {
	o := &operators{actions: a, hashes: map[[sha256.Size]byte]string{}, sessions: map[string]*operatorSession{}}
	for token, name := range a.Operators {
		o.hashes[sha256.Sum256([]byte(token))] = name
	}
	return o
}

// cookieName is the operator session's cookie.
const cookieName = "bmdb_operator"

// signIn returns the name of the operator whose token is token, or "".
// Every configured token is compared, in constant time.
func (o *operators) signIn(token string) string {
	h := sha256.Sum256([]byte(token))
	name := ""
	for k, n := range o.hashes {
		if subtle.ConstantTimeCompare(h[:], k[:]) == 1 {
			name = n
		}
	}
	return name
}

// start makes a session for operator name and returns its cookie value.
func (o *operators) start(name string) string {
	id, csrf := randomToken(), randomToken()
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	for k, s := range o.sessions {
		if now.After(s.expires) {
			delete(o.sessions, k)
		}
	}
	o.sessions[id] = &operatorSession{Name: name, CSRF: csrf, expires: now.Add(ActionSessionLifetime)}
	return id
}

// of returns the operator session of r's cookie, or nil.
func (o *operators) of(r *http.Request) *operatorSession {
	if o == nil {
		return nil
	}
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.sessions[c.Value]
	if s == nil || time.Now().After(s.expires) {
		return nil
	}
	return s
}

// end signs the session of r's cookie out.
func (o *operators) end(r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		o.mu.Lock()
		delete(o.sessions, c.Value)
		o.mu.Unlock()
	}
}

// takeFlash returns s's flash message and clears it.
func (o *operators) takeFlash(s *operatorSession) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	f := s.flash
	s.flash = ""
	return f
}

func (o *operators) setFlash(s *operatorSession, msg string) {
	o.mu.Lock()
	s.flash = msg
	o.mu.Unlock()
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b)
}

// sameOrigin reports whether r came from the handler's own pages: its
// Origin (sent by browsers with every POST) names r's host, and
// Sec-Fetch-Site, if sent, says same-origin.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true // not a browser's cross-site request: the CSRF token decides
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// maxFormBytes bounds the body of a sign-in or an action.
const maxFormBytes = 16 << 10

// loginPage serves GET /login.
func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.renderPage(w, r, http.StatusOK, "login", map[string]any{"Failed": false})
}

// login serves POST /login: a valid token starts an operator session.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if !sameOrigin(r) || r.ParseForm() != nil {
		h.forbid(w, r, "the sign-in did not come from these pages")
		return
	}
	name := h.ops.signIn(r.PostForm.Get("token"))
	if name == "" {
		klog.Warningf("web: failed operator sign-in from %s", r.RemoteAddr)
		time.Sleep(200 * time.Millisecond) // slows guessing
		h.renderPage(w, r, http.StatusForbidden, "login", map[string]any{"Failed": true})
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: h.ops.start(name), Path: h.opts.PathPrefix + "/",
		MaxAge: int(ActionSessionLifetime.Seconds()), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	klog.Infof("web: operator %s signed in from %s", name, r.RemoteAddr)
	http.Redirect(w, r, h.opts.PathPrefix+"/", http.StatusSeeOther)
}

// logout serves POST /logout.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if op, ok := h.checkAction(w, r); ok {
		h.ops.end(r)
		klog.Infof("web: operator %s signed out", op.Name)
	} else {
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: h.opts.PathPrefix + "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, h.opts.PathPrefix+"/", http.StatusSeeOther)
}

// checkAction checks that r is an action of a signed-in operator, from
// the pages (Origin, CSRF token), and parses its form; it answers 403
// itself if not.
func (h *Handler) checkAction(w http.ResponseWriter, r *http.Request) (*operatorSession, bool) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	op := h.ops.of(r)
	switch {
	case op == nil:
		h.forbid(w, r, "sign in as an operator first")
		return nil, false
	case !sameOrigin(r):
		h.forbid(w, r, "the action did not come from these pages")
		return nil, false
	case r.ParseForm() != nil:
		h.fail(w, r, badRequest("unreadable form"), false)
		return nil, false
	case subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(op.CSRF)) != 1:
		h.forbid(w, r, "the form's token is missing or stale: reload the page")
		return nil, false
	}
	return op, true
}

func (h *Handler) forbid(w http.ResponseWriter, r *http.Request, msg string) {
	h.fail(w, r, &httpError{http.StatusForbidden, msg}, wantsJSON(r))
}

// actionTimeout bounds one action: a pause or a cap waits for the claims
// in flight on PostgreSQL.
const actionTimeout = 30 * time.Second

// action serves POST /action/{name}: pause, resume, cap, delete (a
// process's controls), clear-backoff. It runs the action as the signed-in
// operator and returns to the page the form was on (back), where the
// outcome is shown once.
func (h *Handler) action(w http.ResponseWriter, r *http.Request) {
	op, ok := h.checkAction(w, r)
	if !ok {
		return
	}
	f := r.PostForm
	process, reason := f.Get("process"), f.Get("reason")
	ch := bmdb.ControlChange{By: op.Name, Reason: reason}
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	run := func(fn func(*bmdb.Session) (string, error)) (string, error) {
		sess, err := h.ops.actions.Conn.StartSession(ctx)
		if err != nil {
			return "", err
		}
		defer sess.Close(context.WithoutCancel(ctx))
		return fn(sess)
	}
	name := r.PathValue("name")
	if err := h.checkControl(ctx, name, process, f.Get("new") != "", f.Get("lift") != ""); err != nil {
		h.fail(w, r, err, false)
		return
	}
	var msg string
	var err error
	switch name {
	case "pause", "resume":
		msg, err = run(func(s *bmdb.Session) (string, error) {
			do, state := s.PauseProcess, "paused"
			if name == "resume" {
				do, state = s.ResumeProcess, "running"
			}
			changed, err := do(ctx, process, ch)
			return changedMessage(process, state, changed), err
		})
	case "cap":
		n, perr := parseCap(f.Get("cap"))
		if perr != nil {
			h.fail(w, r, perr, false)
			return
		}
		msg, err = run(func(s *bmdb.Session) (string, error) {
			changed, err := s.CapProcess(ctx, process, n, ch)
			state := fmt.Sprintf("capped at %d live claims", n)
			if n == 0 {
				state = "without a cap"
			}
			return changedMessage(process, state, changed), err
		})
	case "delete":
		msg, err = run(func(s *bmdb.Session) (string, error) {
			deleted, err := s.DeleteProcessControls(ctx, process, ch)
			if !deleted {
				return fmt.Sprintf("%s had no controls: nothing changed", process), err
			}
			return fmt.Sprintf("the controls of %s are deleted: its next claim makes them anew, running without a cap", process), err
		})
	case "clear-backoff":
		machine, perr := uuid.Parse(f.Get("machine"))
		if perr != nil {
			h.fail(w, r, badRequest("machine %q is not a machine id", f.Get("machine")), false)
			return
		}
		msg, err = run(func(s *bmdb.Session) (string, error) {
			why := op.Name
			if reason != "" {
				why += ": " + reason
			}
			return fmt.Sprintf("backoff of %s on %s cleared", process, machine), s.ClearBackoff(ctx, machine, process, why)
		})
	}
	switch {
	case errors.Is(err, bmdb.ErrInvalidArgument):
		h.fail(w, r, badRequest("%s", strings.TrimPrefix(err.Error(), bmdb.ErrInvalidArgument.Error()+": ")), false)
		return
	case errors.Is(err, bmdb.ErrNoBackoff):
		msg = "no backoff to clear: " + err.Error()
	case err != nil:
		klog.Warningf("web: action %s by %s: %v", r.URL.Path, op.Name, err)
		h.fail(w, r, fmt.Errorf("web: action: %w", err), false)
		return
	default:
		klog.Infof("web: operator %s: %s (%s)", op.Name, msg, reason)
	}
	h.ops.setFlash(op, msg)
	http.Redirect(w, r, h.back(f.Get("back")), http.StatusSeeOther)
}

// checkControl checks action name on process before it runs, as bmdbctl
// does: a pause, resume or cap of a process the database does not know is
// refused unless isNew (most likely a typo); the deletion of controls in
// force unless lift. It answers 404 for an unknown action.
func (h *Handler) checkControl(ctx context.Context, name, process string, isNew, lift bool) error {
	switch name {
	case "pause", "resume", "cap":
		if isNew || bmdb.ValidateProcess(process) != nil { // bmdb names what is wrong with the name
			return nil
		}
		err := fleet.CheckProcessKnown(ctx, h.db, process)
		if errors.Is(err, fleet.ErrUnknownProcess) {
			return badRequest("%v; tick “new process” to %s it anyway", err, name)
		}
		return err
	case "delete":
		if lift || bmdb.ValidateProcess(process) != nil {
			return nil
		}
		c, ok, err := fleet.ReadProcessControl(ctx, h.db, process)
		if err != nil || !ok || !c.InForce() {
			return err
		}
		return badRequest("%s is %s: deleting its controls lifts that; tick “lift” to delete them anyway", process, c.State())
	case "clear-backoff":
		return nil
	}
	return notFound("no action %q", name)
}

// parseCap parses a cap form's cap: a number of live claims, or none (0).
func parseCap(v string) (int, error) {
	if v == "none" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, badRequest("cap %q: give a number of live claims from 1 to %d, or none", v, bmdb.MaxCap)
	}
	return n, nil
}

// changedMessage says what an action did to process.
func changedMessage(process, state string, changed bool) string {
	if changed {
		return fmt.Sprintf("%s is now %s", process, state)
	}
	return fmt.Sprintf("%s was already %s: nothing changed", process, state)
}

// back returns where an action returns to: path, a page of the handler's
// (a relative path without a host), or the overview.
func (h *Handler) back(path string) string {
	u, err := url.Parse(path)
	if err != nil || path == "" || u.IsAbs() || u.Host != "" || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return h.opts.PathPrefix + "/"
	}
	return h.opts.PathPrefix + u.RequestURI()
}
