// Package web serves pages about a bmdb fleet: machines per stage, live
// sessions, claims, backoffs and history, each also as JSON (?format=json
// or Accept: application/json). Mount it in any component:
//
//	mux.Handle("/bmdb/", http.StripPrefix("/bmdb", web.New(conn.DB(), web.Options{PathPrefix: "/bmdb"})))
//
// What the pages show is package fleet's read model, which bmdbctl reads
// too: web is the HTTP side of it, handlers (pages.go), templates and
// plots, the operators' actions (actions.go) and the security headers
// (security.go). A page's JSON is the fleet type it renders.
//
// Stuck work comes first: the overview shows per process its claims held
// by expired sessions (stuck until the next takeover or GC) and their age,
// the oldest live claim, the machines waiting for it (stuck, in or past
// backoff, and ready per the application's optional app_pending_work
// view: see fleet.ViewPendingWork) and a warning when some wait and no live
// session of the components that do the process is left. Machine lists
// say who holds each machine since when and why it is in backoff, and sort
// by claim age. Times are shown absolute and relative to the database
// clock; every page refreshes itself every 5 s (a small script fetches the
// page again and swaps its content; a pause button stops it) and says when
// it was read. The overview plots, as inline SVG (plots.go), the Finished,
// Failed and Abandoned events per minute of each process over the last
// hour and the ages of the claims now.
//
// The overview shows each process's fleet controls (paused, cap, live
// claims; a banner per paused process). With Options.Actions, operators
// who sign in with a token get buttons to pause, resume and cap a process,
// to delete its controls and to clear a backoff (see Actions); without,
// the pages never write. Every response sends a Content-Security-Policy
// that allows only the handler's own script and style sheet (no inline
// script or style) and no framing, and X-Content-Type-Options: nosniff
// (security.go). Every request runs its reads under Options.QueryTimeout.
package web

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/fleet"
)

// QueryTimeoutDefault is the default Options.QueryTimeout.
const QueryTimeoutDefault = 5 * time.Second

// Options configure a Handler.
type Options struct {
	// PathPrefix is where the handler is mounted (with http.StripPrefix),
	// for the links it renders, e.g. "/bmdb". Defaults to "" (the root).
	PathPrefix string
	// QueryTimeout bounds the queries of one request. Defaults to
	// QueryTimeoutDefault.
	QueryTimeout time.Duration
	// Actions, if set, lets signed-in operators act (see Actions).
	// Defaults to nil: read-only pages.
	Actions *Actions
}

// Handler is the http.Handler of the pages. It is safe for concurrent use.
type Handler struct {
	db    *sql.DB
	opts  Options
	mux   *http.ServeMux
	ops   *operators // nil without Options.Actions
	serve http.Handler
}

// New returns a Handler reading from db, which it does not close.
func New(db *sql.DB, opts Options) *Handler {
	if opts.QueryTimeout <= 0 {
		opts.QueryTimeout = QueryTimeoutDefault
	}
	opts.PathPrefix = strings.TrimRight(opts.PathPrefix, "/")
	h := &Handler{db: db, opts: opts, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /{$}", h.page("overview", h.overview))
	h.mux.HandleFunc("GET /machines", h.page("machines", h.machines))
	h.mux.HandleFunc("GET /machine/{id}", h.page("machine", h.machine))
	h.mux.HandleFunc("GET /session/{id}", h.page("session", h.session))
	h.mux.Handle("GET /static/", static)
	if opts.Actions != nil {
		h.ops = newOperators(opts.Actions)
		h.mux.HandleFunc("GET /login", h.loginPage)
		h.mux.HandleFunc("POST /login", h.login)
		h.mux.HandleFunc("POST /logout", h.logout)
		h.mux.HandleFunc("POST /action/{name}", h.action)
	}
	h.serve = secure(h.mux)
	return h
}

// ServeHTTP serves one request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.serve.ServeHTTP(w, r) }

// httpError is an error with the status to answer it with.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &httpError{http.StatusNotFound, fmt.Sprintf(format, args...)}
}

// loader loads a page's data for a request.
type loader func(ctx context.Context, r *http.Request) (any, error)

// page returns the handler of one page: it loads the data under the query
// timeout and renders it as HTML or JSON.
func (h *Handler) page(name string, load loader) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), h.opts.QueryTimeout)
		defer cancel()
		data, err := load(ctx, r)
		asJSON := wantsJSON(r)
		if err != nil {
			h.fail(w, r, err, asJSON)
			return
		}
		if asJSON {
			writeJSON(w, http.StatusOK, data)
			return
		}
		h.renderPage(w, r, http.StatusOK, name, data)
	}
}

// renderPage writes page name with data as HTML, with the signed-in
// operator's forms and the outcome of their last action, if any.
func (h *Handler) renderPage(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	v := view{Prefix: h.opts.PathPrefix, Data: data, Actions: h.ops != nil}
	if op := h.ops.of(r); op != nil {
		v.Op, v.Flash = op, h.ops.takeFlash(op)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := render(w, name, v); err != nil {
		klog.Warningf("web: rendering %s: %v", r.URL.Path, err)
	}
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error, asJSON bool) {
	var he *httpError
	var fe *fleet.Error
	switch {
	case errors.As(err, &he):
	case errors.As(err, &fe) && errors.Is(fe, fleet.ErrNotFound):
		he = &httpError{http.StatusNotFound, fe.Msg}
	case errors.As(err, &fe):
		he = &httpError{http.StatusBadRequest, fe.Msg}
	default:
		klog.Warningf("web: %s: %v", r.URL.Path, err)
		he = &httpError{http.StatusInternalServerError, "the database did not answer in time or failed; see the server log"}
		var pqErr *pq.Error
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &pqErr) && pqErr.Code == "57014") {
			he.status = http.StatusServiceUnavailable // the query timeout cancelled it
		}
	}
	if asJSON {
		writeJSON(w, he.status, map[string]string{"error": he.msg})
		return
	}
	h.renderPage(w, r, he.status, "error", map[string]any{"Status": he.status, "Message": he.msg})
}

// wantsJSON reports whether the client asked for JSON.
func wantsJSON(r *http.Request) bool {
	if f := r.URL.Query().Get("format"); f != "" {
		return f == "json"
	}
	return strings.Contains(r.Header.Get("Accept"), "application/json")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		klog.Warningf("web: writing JSON: %v", err)
	}
}

// parseID parses a path or query UUID, naming what it is in the error.
func parseID(what, s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, badRequest("%s id %q is not a UUID", what, s)
	}
	return id, nil
}
