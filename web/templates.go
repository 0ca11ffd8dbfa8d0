package web

import (
	"embed"
	"fmt"
	"html/template"
	"io"
	"net/url"
	"time"

	"github.com/google/uuid"
)

//go:embed templates/*.html
var templateFS embed.FS

// pages holds one template set per page, each with the shared layout.
var pages = map[string]*template.Template{}

func init() {
	for _, name := range []string{"overview", "machines", "machine", "session", "error"} {
		pages[name] = template.Must(template.New("layout.html").Funcs(funcs).
			ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
}

var funcs = template.FuncMap{
	"ts": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
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
	"short": func(id uuid.UUID) string { return id.String()[:8] },
	"query": urlQueryEscape,
	// filterQuery renders a machine filter as query parameters ending in &.
	"filterQuery": func(f MachineFilter) template.URL {
		if q := f.query(); q != "" {
			return template.URL(q + "&")
		}
		return ""
	},
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// render writes page name with data; prefix is where the handler is mounted.
func render(w io.Writer, name, prefix string, data any) error {
	return pages[name].Execute(w, map[string]any{"Prefix": prefix, "Data": data})
}
