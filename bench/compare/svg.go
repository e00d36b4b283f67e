package compare

import (
	"bytes"
	"fmt"
	"html"
	"math"
)

// chartSchemes are drawn one above the other: a Redis-only lock and fenced.
var chartSchemes = []string{Redislock, FencedRedis}

var laneColors = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2"}

// Chart draws, for one fault, each holder of the lock over time (a bar
// from its grant to its release, labelled with its token) and every write
// (admitted or rejected), around the fault, for a Redis-only lock and for
// fenced. Plain SVG text, no dependency.
func Chart(rep *Report, faultID string) ([]byte, bool) {
	var panels []Result
	for _, id := range chartSchemes {
		for _, r := range rep.Results {
			if r.Fault == faultID && r.Scheme == id && r.marks["inject"] != 0 {
				panels = append(panels, r)
			}
		}
	}
	if len(panels) == 0 {
		return nil, false
	}
	f, _ := faultByID(faultID)
	const (
		width   = 960
		left    = 110
		right   = 20
		laneH   = 34
		panelH  = 3*laneH + 70
		headerH = 70
	)
	height := headerH + len(panels)*panelH + 40
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">%s: %s</text>`+"\n", left-90, html.EscapeString(f.ID), html.EscapeString(f.Title))
	fmt.Fprintf(&b, `<text x="%d" y="42" fill="#555">Bars: who believes it holds the lock, from its grant to its release (with its token, if it has one).</text>`+"\n", left-90)
	fmt.Fprintf(&b, `<text x="%d" y="56" fill="#555">● write admitted   ✕ rejected by the fence (stale token)   ◦ read admitted by the fence</text>`+"\n", left-90)
	for pi, r := range panels {
		y0 := headerH + pi*panelH
		h := r.history
		inject := r.marks["inject"]
		var late attempt
		// The window: from before the fault to after worker 1's late write.
		// The fault step only: from worker 1's held transfer to the end of
		// the step, when every worker has finished.
		fs, fe := r.marks["fault"], r.marks["fault-end"]
		span := fe - fs
		t0, t1 := fs-span/20, fe+span/20
		for _, at := range h.Attempts {
			if at.Worker == 1 && at.Kind == evWrite && at.Inv > inject && at.Ret != math.MaxInt64 {
				late = at
				break
			}
		}
		_ = late
		x := func(t int64) float64 {
			t = max(t0, min(t, t1))
			return left + float64(t-t0)/float64(t1-t0)*float64(width-left-right)
		}
		title := r.Scheme
		if s, ok := schemeByID(r.Scheme); ok {
			title += " — " + s.Title
		}
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", y0+16, html.EscapeString(title))
		summary := fmt.Sprintf("overlapping holders %d · stale writes admitted %d · stale rejected %d · lost updates %d", r.Overlaps, r.StaleAdmitted, r.StaleRejected, r.LostUpdates)
		color := "#2e7d32"
		if r.StaleAdmitted > 0 || r.LostUpdates > 0 {
			color = "#c62828"
		}
		fmt.Fprintf(&b, `<text x="10" y="%d" fill="%s">%s</text>`+"\n", y0+32, color, summary)
		ly := y0 + 44
		for w := 1; w <= 3; w++ {
			y := ly + (w-1)*laneH
			fmt.Fprintf(&b, `<text x="10" y="%d">worker %d</text>`+"\n", y+laneH/2+4, w)
			fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`+"\n", left, y+laneH-2, width-right, y+laneH-2)
		}
		// The fault.
		fx := x(inject)
		label := map[string]string{FPause: "SIGSTOP worker 1", FFailover: "primary killed, replica promoted"}[r.Fault]
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c62828" stroke-dasharray="4,3"/>`+"\n", fx, ly-4, fx, ly+3*laneH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#c62828" font-size="11">%s</text>`+"\n", fx+4, ly+3*laneH+12, label)
		for _, g := range h.Grants {
			if g.OK < fs || g.OK > fe || g.Worker > 3 {
				continue
			}
			y := ly + (g.Worker-1)*laneH + 6
			x1, x2 := x(g.OK), x(g.End)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="3" fill="%s" fill-opacity="0.35" stroke="%s"/>`+"\n",
				x1, y, math.Max(x2-x1, 1.5), laneH-16, laneColors[(g.Worker-1)%len(laneColors)], laneColors[(g.Worker-1)%len(laneColors)])
			lbl := g.Holder
			if g.Token != 0 {
				lbl = fmt.Sprintf("token …%d", g.Token%10000)
			}
			if x2-x1 > 80 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11">%s</text>`+"\n", x1+4, y+13, html.EscapeString(lbl))
			} else if g.Token != 0 && g.OK > inject && g.OK < inject+(t1-inject)/2 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11">%s</text>`+"\n", x2+8, y+13, html.EscapeString(lbl))
			}
		}
		for _, at := range h.Attempts {
			if at.Ret == math.MaxInt64 || at.Inv < fs || at.Ret > fe || at.Worker > 3 {
				continue
			}
			cx, cy := x(at.Ret), float64(ly+(at.Worker-1)*laneH+laneH/2-2)
			switch {
			case at.Outcome == outRejected:
				fmt.Fprintf(&b, `<path d="M%.1f %.1f l8 8 m0 -8 l-8 8" stroke="#c62828" stroke-width="2.5"/>`+"\n", cx-4, cy-4)
			case at.Kind == evWrite && at.Outcome == outAdmitted:
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="#2e7d32"/>`+"\n", cx, cy)
			case at.Kind == evRead && at.Outcome == outAdmitted:
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="white" stroke="#2e7d32" stroke-width="1.5"/>`+"\n", cx, cy)
			}
		}
		if late.Ret != 0 {
			verdict, col := "worker 1's late write: ADMITTED", "#c62828"
			if late.Outcome == outRejected {
				verdict, col = "worker 1's late write: rejected, stale token", "#2e7d32"
			}
			lx, anchor := x(late.Ret)-10, "end"
			if lx < left+260 {
				lx, anchor = x(late.Ret)+10, "start"
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="%s" font-size="11" text-anchor="%s" font-weight="bold">%s</text>`+"\n", lx, ly+4, col, anchor, verdict)
		}
		// Time axis.
		ay := ly + 3*laneH + 24
		step := int64(1e9)
		for _, st := range []int64{10e6, 20e6, 50e6, 100e6, 200e6, 250e6, 500e6, 1e9, 2e9} {
			if (t1-t0)/st <= 8 {
				step = st
				break
			}
		}
		for t := inject - (inject-t0)/step*step; t <= t1; t += step {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#777" text-anchor="middle">%+.2fs</text>`+"\n", x(t), ay, float64(t-inject)/1e9)
		}
	}
	fmt.Fprintf(&b, `<text x="10" y="%d" font-size="10" fill="#777">Time relative to the fault. Generated by bench/cmd/compare from the histories its checkers read.</text>`+"\n", height-10)
	b.WriteString("</svg>\n")
	return b.Bytes(), true
}
