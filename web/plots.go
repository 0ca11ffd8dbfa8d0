package web

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/fleet"
)

// The plots are SVG rendered here, inline in the page: no script, no
// external asset, no style attribute (colours are SVG attributes), so the
// Content-Security-Policy needs no 'unsafe-inline'. They draw package
// fleet's series (fleet.EventRates, fleet.ClaimAges).

// Plot colours, one per event and claim state; the legends' are the style
// sheet's (.legend .finished, ...).
const (
	colorFinished  = "#2e8b57"
	colorFailed    = "#c0392b"
	colorAbandoned = "#e67e22"
	colorAlive     = "#3b6fb6"
)

// eventsPlot renders e as stacked bars, one per minute.
func eventsPlot(e fleet.EventRates) template.HTML {
	const w, h, top, bottom, left = 620, 110, 14, 18, 34
	barW := float64(w-left) / fleet.EventMinutes
	var most int64 = 1
	for i := range e.Finished {
		most = max(most, e.Finished[i]+e.Failed[i]+e.Abandoned[i])
	}
	scale := float64(h-top-bottom) / float64(most)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="plot events" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s events per minute">`,
		w, h, w, h, template.HTMLEscapeString(e.Process))
	axes(&b, w, h, top, bottom, left, most)
	for i := range e.Finished {
		x := float64(left) + float64(i)*barW
		minute := e.Since.Add(time.Duration(i) * time.Minute).UTC().Format("15:04")
		tip := fmt.Sprintf("%s: %d finished, %d failed, %d abandoned", minute, e.Finished[i], e.Failed[i], e.Abandoned[i])
		stackedBar(&b, x+0.5, barW-1, float64(h-bottom), scale, tip,
			segment{e.Finished[i], colorFinished}, segment{e.Failed[i], colorFailed}, segment{e.Abandoned[i], colorAbandoned})
	}
	for _, tick := range []struct {
		x             float64
		anchor, label string
	}{{left, "start", "−60 m"}, {float64(left) + 30*barW, "middle", "−30 m"}, {w, "end", "now"}} {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#6b7280" text-anchor="%s">%s</text>`, tick.x, h-4, tick.anchor, tick.label)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// axes draws the y axis of a bar chart whose tallest bar is most.
func axes(b *strings.Builder, w, h, top, bottom, left int, most int64) {
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#9aa3af"/>`, left, h-bottom, w, h-bottom)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#e3e6eb"/>`, left, top, w, top)
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="10" fill="#6b7280" text-anchor="end">%d</text>`, left-4, top+4, most)
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="10" fill="#6b7280" text-anchor="end">0</text>`, left-4, h-bottom)
}

// agesPlot renders c as bars, live claims below expired ones.
func agesPlot(c fleet.ClaimAges) template.HTML {
	const w, h, top, bottom, left = 620, 140, 16, 22, 34
	barW := float64(w-left) / float64(len(c))
	var most int64 = 1
	for _, a := range c {
		most = max(most, a.Alive+a.Expired)
	}
	scale := float64(h-top-bottom) / float64(most)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="plot ages" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="claim ages">`, w, h, w, h)
	axes(&b, w, h, top, bottom, left, most)
	for i, a := range c {
		x := float64(left) + float64(i)*barW
		tip := fmt.Sprintf("%s: %d live, %d held by expired sessions", a.Label, a.Alive, a.Expired)
		y := stackedBar(&b, x+4, barW-8, float64(h-bottom), scale, tip,
			segment{a.Alive, colorAlive}, segment{a.Expired, colorFailed})
		if n := a.Alive + a.Expired; n > 0 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%d</text>`, x+barW/2, y-3, n)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#6b7280" text-anchor="middle">%s</text>`, x+barW/2, h-6, template.HTMLEscapeString(a.Label))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// segment is one part of a stacked bar: a count and its colour.
type segment struct {
	n     int64
	color string
}

// stackedBar draws segs as one bar at x, width w, stacked up from the
// baseline y, scale pixels a count, each segment titled tip (empty
// segments are left out); it returns the top of the bar.
func stackedBar(b *strings.Builder, x, w, y, scale float64, tip string, segs ...segment) float64 {
	for _, seg := range segs {
		if seg.n == 0 {
			continue
		}
		hh := float64(seg.n) * scale
		y -= hh
		fmt.Fprintf(b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`,
			x, y, w, hh, seg.color, template.HTMLEscapeString(tip))
	}
	return y
}
