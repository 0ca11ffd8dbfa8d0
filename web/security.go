package web

import (
	"embed"
	"net/http"
)

// Every response carries headers that keep other sites from framing the
// pages (their action buttons included) or running anything in them: the
// pages load their script and style sheet from the handler itself
// (static/), the script, not inline code, refreshes them, and no page has
// a style attribute or element (the plots colour with SVG attributes, the
// legends with the style sheet's classes), so inline styles are refused
// too.

// contentSecurityPolicy allows the handler's own script and style sheet
// and nothing else: no inline script or style, no framing, no form posted
// elsewhere.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// secure sets the security headers of every response, then serves it.
func secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

//go:embed static
var staticFS embed.FS

// static serves the pages' script and style sheet.
var static = http.FileServerFS(staticFS)
