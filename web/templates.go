package web

import (
	"embed"
	"fmt"
	"html/template"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/fleet"
)

//go:embed templates/*.html
var templateFS embed.FS

// pages holds one template set per page, each with the shared layout.
var pages = map[string]*template.Template{}

func init() {
	for _, name := range []string{"overview", "machines", "machine", "session", "error", "login"} {
		pages[name] = template.Must(template.New("layout.html").Funcs(funcs).
			ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
}

var funcs = template.FuncMap{
	"maxCap": func() int { return bmdb.MaxCap },
	"ts":     func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"secs": func(s float64) string {
		d := time.Duration(s * float64(time.Second))
		switch {
		case d < time.Minute:
			return fmt.Sprintf("%.1fs", d.Seconds())
		case d < time.Hour:
			return fmt.Sprintf("%.1fm", d.Minutes())
		}
		return fmt.Sprintf("%.1fh", d.Hours())
	},
	// rel says when t is from now: "3 s ago", "in 2 m".
	"rel": func(now, t time.Time) string { return relative(t.Sub(now)) },
	// left says when something ends secs from now: "in 2 m".
	"left": func(secs float64) string { return relative(time.Duration(secs * float64(time.Second))) },
	// ago says when something began secs ago: "3 s ago".
	"ago":   func(secs float64) string { return relative(-time.Duration(secs * float64(time.Second))) },
	"short": func(id uuid.UUID) string { return id.String()[:8] },
	// count says n things: "1 claim", "3 claims".
	"count": func(n any, thing string) string {
		if s := fmt.Sprint(n); s != "1" {
			return s + " " + thing + "s"
		}
		return "1 " + thing
	},
	"query": urlQueryEscape,
	// filterQuery renders a machine filter as query parameters ending in &.
	"filterQuery": func(f fleet.MachineFilter) template.URL {
		if q := filterQuery(f); q != "" {
			return template.URL(q + "&")
		}
		return ""
	},
	"eventsPlot": eventsPlot,
	"agesPlot":   agesPlot,
}

// filterQuery returns a machine filter as URL query parameters.
func filterQuery(f fleet.MachineFilter) string {
	var parts []string
	for _, kv := range [][2]string{{"stage", f.Stage}, {"process", f.Process}, {"backoff", f.Backoff}, {"sort", f.Sort}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+urlQueryEscape(kv[1]))
		}
	}
	return strings.Join(parts, "&")
}

// relative renders d, an offset from now, as people say it: "3 s ago",
// "in 2 m", "now".
func relative(d time.Duration) string {
	past := d < 0
	if past {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		s = fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		s = fmt.Sprintf("%d m", int(d.Minutes()))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%d h", int(d.Hours()))
	default:
		s = fmt.Sprintf("%d d", int(d.Hours()/24))
	}
	if past {
		return s + " ago"
	}
	return "in " + s
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// view is what a page's template gets.
type view struct {
	Prefix  string           // where the handler is mounted
	Data    any              // the page's own
	Actions bool             // operators may sign in (Options.Actions)
	Op      *operatorSession // the signed-in operator, or nil
	Flash   string           // the outcome of the operator's last action
}

// render writes page name with v.
func render(w io.Writer, name string, v view) error {
	return pages[name].Execute(w, v)
}
