package lockbench

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// A small SVG line chart: log-scaled x, linear or log y, one line per
// implementation. Enough for the scaling curves, with no dependency.

type series struct {
	name string
	xs   []float64
	ys   []float64
}

type panel struct {
	title, xlabel, ylabel string
	logY                  bool
	series                []series
}

var seriesColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"}

const (
	panelW, panelH = 460, 300
	marginL        = 70
	marginR        = 20
	marginT        = 40
	marginB        = 50
)

// svgPanels draws panels side by side, with one legend for all.
func svgPanels(title string, panels []panel) string {
	w := panelW * len(panels)
	h := panelH + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="14" font-weight="bold" text-anchor="middle">%s</text>`+"\n", w/2, html.EscapeString(title))
	for i, p := range panels {
		drawPanel(&b, p, i*panelW, 20)
	}
	// Legend, from the first panel's series.
	if len(panels) > 0 {
		x := 20
		for i, s := range panels[0].series {
			c := seriesColors[i%len(seriesColors)]
			fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2.5"/>`, x, h-12, x+24, h-12, c)
			fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", x+30, h-8, html.EscapeString(s.name))
			x += 40 + 8*len(s.name)
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func drawPanel(b *strings.Builder, p panel, ox, oy int) {
	x0, y0 := float64(ox+marginL), float64(oy+marginT)
	pw, ph := float64(panelW-marginL-marginR), float64(panelH-marginT-marginB)
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.series {
		for i := range s.xs {
			if s.xs[i] <= 0 || (p.logY && s.ys[i] <= 0) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.xs[i]), math.Max(xmax, s.xs[i])
			ymin, ymax = math.Min(ymin, s.ys[i]), math.Max(ymax, s.ys[i])
		}
	}
	if math.IsInf(xmin, 0) {
		return
	}
	lxmin, lxmax := math.Floor(math.Log10(xmin)), math.Ceil(math.Log10(xmax))
	if lxmax == lxmin {
		lxmax++
	}
	var fy func(float64) float64
	var yticks []float64
	if p.logY {
		lymin, lymax := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
		if lymax == lymin {
			lymax++
		}
		fy = func(v float64) float64 { return y0 + ph - (math.Log10(v)-lymin)/(lymax-lymin)*ph }
		for e := lymin; e <= lymax; e++ {
			yticks = append(yticks, math.Pow(10, e))
		}
	} else {
		ymin = 0
		step := niceStep(ymax / 5)
		ymax = math.Ceil(ymax/step) * step
		if ymax == 0 {
			ymax = 1
		}
		fy = func(v float64) float64 { return y0 + ph - v/ymax*ph }
		for v := 0.0; v <= ymax+step/2; v += step {
			yticks = append(yticks, v)
		}
	}
	fx := func(v float64) float64 { return x0 + (math.Log10(v)-lxmin)/(lxmax-lxmin)*pw }

	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold" text-anchor="middle">%s</text>`+"\n", x0+pw/2, y0-12, html.EscapeString(p.title))
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", x0, y0, pw, ph)
	for e := lxmin; e <= lxmax; e++ {
		x := fx(math.Pow(10, e))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/>`, x, y0, x, y0+ph)
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x, y0+ph+16, num(math.Pow(10, e)))
	}
	for _, v := range yticks {
		y := fy(v)
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`, x0, y, x0+pw, y)
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, num(v))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x0+pw/2, y0+ph+36, html.EscapeString(p.xlabel))
	fmt.Fprintf(b, `<text transform="translate(%.0f %.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(ox+16), y0+ph/2, html.EscapeString(p.ylabel))
	for i, s := range p.series {
		c := seriesColors[i%len(seriesColors)]
		var pts []string
		for j := range s.xs {
			if s.xs[j] <= 0 || (p.logY && s.ys[j] <= 0) {
				continue
			}
			x, y := fx(s.xs[j]), fy(s.ys[j])
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, x, y, c)
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), c)
	}
}

// niceStep rounds a raw tick step to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// num formats an axis value: 1k, 2.5M, 0.1.
func num(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "M"
	case v >= 1e3:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	case v >= 1 || v == 0:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%g", v)
	}
}

// curves makes one series per implementation, in ScalingImpls' order, of
// the points whose implementation and x at says, and y.
func curves[P any](points []P, at func(P) (impl string, x float64), y func(P) float64) []series {
	var out []series
	for _, name := range ScalingImpls {
		s := series{name: name}
		for _, p := range points {
			if impl, x := at(p); impl == name {
				s.xs, s.ys = append(s.xs, x), append(s.ys, y(p))
			}
		}
		if len(s.xs) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// WriteScalingSVGs writes scaling-clients.svg and scaling-held.svg into
// dir and returns their paths.
func WriteScalingSVGs(dir string, rep *ScalingReport) ([]string, error) {
	clients := func(y func(ClientPoint) float64) []series {
		return curves(rep.Clients, func(p ClientPoint) (string, float64) { return p.Impl, float64(p.Clients) }, y)
	}
	held := func(y func(HeldPoint) float64) []series {
		return curves(rep.Held, func(p HeldPoint) (string, float64) { return p.Impl, float64(p.Held) }, y)
	}
	var paths []string
	write := func(name, svg string) error {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(svg), 0o644); err != nil {
			return err
		}
		paths = append(paths, path)
		return nil
	}
	if len(rep.Clients) > 0 {
		svg := svgPanels("fenced scaling: concurrent clients, each on its own lock name", []panel{
			{title: "throughput", xlabel: "clients", ylabel: "acquire+release pairs/s", series: clients(ClientPoint.OpsPerSec)},
			{title: "p99 of one pair", xlabel: "clients", ylabel: "ms", logY: true, series: clients(func(p ClientPoint) float64 { return ms(p.P99) })},
			{title: "CPU per pair (process + Redis)", xlabel: "clients", ylabel: "µs", series: clients(func(p ClientPoint) float64 { return us(p.CPUPerOp()) })},
		})
		if err := write("scaling-clients.svg", svg); err != nil {
			return paths, err
		}
	}
	if len(rep.Held) > 0 {
		svg := svgPanels("fenced scaling: locks held at once, each kept alive", []panel{
			{title: "CPU to keep them, above idle", xlabel: "locks held", ylabel: "ms of CPU per second", logY: true,
				series: held(func(p HeldPoint) float64 { return ms(p.CPUPerSec()) })},
			{title: "memory per held lock: process", xlabel: "locks held", ylabel: "bytes", logY: true,
				series: held(func(p HeldPoint) float64 { b, _, _ := p.BytesPerLock(); return b })},
			{title: "memory per held lock: Redis + etcd", xlabel: "locks held", ylabel: "bytes", logY: true,
				series: held(func(p HeldPoint) float64 { _, r, e := p.BytesPerLock(); return r + e })},
		})
		if err := write("scaling-held.svg", svg); err != nil {
			return paths, err
		}
	}
	return paths, nil
}
