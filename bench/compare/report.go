package compare

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// The table: one row per scheme under a fault.
var columns = []string{"fault", "scheme", "overlapping holders", "stale writes admitted", "stale rejected",
	"current holders rejected", "lost updates", "tokens repeated/back", "acq/s", "linearizable", "notes"}

func (r Result) cells() []string {
	tok := "-"
	if r.Mutex != "" {
		tok = fmt.Sprint(r.TokensBad)
	}
	lin := r.Linearizable
	if r.Mutex == "" {
		lin += " (register)"
	}
	var notes []string
	if r.Control {
		notes = append(notes, "control: documented step skipped")
	}
	if r.KnownDefect != "" {
		notes = append(notes, "known defect: "+r.KnownDefect)
	}
	if r.Error != "" {
		notes = append(notes, "ERROR: "+r.Error)
	}
	notes = append(notes, r.Notes...)
	if r.Gate != "" {
		notes = append(notes, "GATE: "+r.Gate)
	}
	return []string{r.Fault, r.Scheme, fmt.Sprint(r.Overlaps), fmt.Sprint(r.StaleAdmitted), fmt.Sprint(r.StaleRejected),
		fmt.Sprint(r.CurrentRejected), fmt.Sprint(r.LostUpdates), tok, fmt.Sprintf("%.0f", r.AcqPerSec), lin, strings.Join(notes, "; ")}
}

// WriteText prints the table for a terminal.
func WriteText(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(columns, "\t"))
	prev := ""
	for _, r := range rep.Results {
		if r.Fault != prev && prev != "" {
			fmt.Fprintln(tw)
		}
		prev = r.Fault
		fmt.Fprintln(tw, strings.Join(r.cells(), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeVerdict(w, rep)
}

func writeVerdict(w io.Writer, rep *Report) error {
	if len(rep.Failures) == 0 {
		known, controls := 0, 0
		for _, r := range rep.Results {
			if r.KnownDefect != "" {
				known++
			}
			if r.Fenced && r.Control {
				controls++
			}
		}
		_, err := fmt.Fprintf(w, "\nfenced passed the gate: no stale write admitted, no lost update, no repeated token, every history linearizable, "+
			"except %d scenario(s) of a known defect (expected, reported) and %d control(s) that skip raise-floor (%d scenarios, %.0f s, load %s)\n",
			known, controls, len(rep.Results), rep.Seconds, rep.Loadavg)
		return err
	}
	fmt.Fprintln(w, "\nFENCED FAILED:")
	for _, f := range rep.Failures {
		fmt.Fprintln(w, "  "+f)
	}
	return nil
}

// WriteMarkdown writes the table as Markdown; each fault links to its
// description below the table (or to descLink+"#"+anchor when given, for
// a copy in another document).
func WriteMarkdown(w io.Writer, rep *Report, descLink string) error {
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(columns, " | "), strings.Repeat("---|", len(columns)))
	for _, r := range rep.Results {
		c := r.cells()
		f, _ := faultByID(r.Fault)
		c[0] = fmt.Sprintf("[%s](%s#%s)", r.Fault, descLink, anchor(f))
		if r.Fenced {
			c[1] = "**" + c[1] + "**"
		}
		for i := range c {
			c[i] = strings.ReplaceAll(c[i], "|", "\\|")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(c, " | "))
	}
	if len(rep.Failures) > 0 {
		fmt.Fprintln(w, "\n**fenced failed:**")
		for _, f := range rep.Failures {
			fmt.Fprintln(w, "- "+f)
		}
	}
	fmt.Fprintf(w, "\n%d scenarios in %.0f s (load average %s at the start)%s.\n", len(rep.Results), rep.Seconds, rep.Loadavg, map[bool]string{true: ", short run"}[rep.Short])
	return nil
}

// WriteFaults writes the descriptions of the faults and the schemes that the
// table links to.
func WriteFaults(w io.Writer) {
	fmt.Fprintln(w, "## Schemes")
	fmt.Fprintln(w)
	for _, s := range schemes {
		fmt.Fprintf(w, "- **%s**: %s.\n", s.ID, s.Title)
	}
	fmt.Fprintln(w, "\n## Faults")
	for _, f := range faults {
		fmt.Fprintf(w, "\n### %s\n\n<a id=\"%s\"></a>Fault %d of the issue. %s\n", f.ID, anchor(f), f.Number, f.Desc)
	}
}

func anchor(f fault) string { return "fault-" + f.ID }

// WriteJSON writes the report as one line of JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// faultColumns are the matrix's columns, in the order of faults.
var faultColumns = []string{FPause, FFailover, FRestart, FLeaderKill, FLeaderFreeze, FPartRedis, FLatRedis,
	FPartEtcd, FLatEtcd, FClockJump, FRestoreNewest, FRestoreOther, FRestoreNew, FRestoreRaise}

// WriteMatrix writes the results as one row per scheme and one column per
// fault. A cell is "overlapping holders · stale writes admitted · stale
// rejected · lost updates" and ✓ or ✗ for the linearizability checks, and
// links to the fault's description at descLink.
func WriteMatrix(w io.Writer, rep *Report, descLink string) {
	idx := map[[2]string]Result{}
	for _, r := range rep.Results {
		idx[[2]string{r.Scheme, r.Fault}] = r
	}
	var cols []string
	for _, f := range faultColumns {
		for _, r := range rep.Results {
			if r.Fault == f {
				cols = append(cols, f)
				break
			}
		}
	}
	fmt.Fprint(w, "| scheme | acq/s |")
	for _, f := range cols {
		ft, _ := faultByID(f)
		fmt.Fprintf(w, " %d. %s |", ft.Number, f)
	}
	fmt.Fprintf(w, "\n|---|---:|%s\n", strings.Repeat("---|", len(cols)))
	for _, s := range schemes {
		var rs []Result
		for _, f := range cols {
			if r, ok := idx[[2]string{s.ID, f}]; ok {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		name := s.ID
		if s.Fenced {
			name = "**" + name + "**"
		}
		acq := "-"
		if r, ok := idx[[2]string{s.ID, FPause}]; ok {
			acq = fmt.Sprintf("%.0f", r.AcqPerSec)
		}
		fmt.Fprintf(w, "| %s | %s |", name, acq)
		for _, f := range cols {
			r, ok := idx[[2]string{s.ID, f}]
			if !ok {
				fmt.Fprint(w, " — |")
				continue
			}
			mark := "✓"
			if r.Linearizable != "yes" {
				mark = "✗"
			}
			cell := fmt.Sprintf("%d·%d·%d·%d %s", r.Overlaps, r.StaleAdmitted, r.StaleRejected, r.LostUpdates, mark)
			if r.StaleAdmitted > 0 || r.LostUpdates > 0 {
				cell = "**" + cell + "**"
			}
			if r.CurrentRejected > 0 {
				cell += fmt.Sprintf(" ⊘%d", r.CurrentRejected)
			}
			if r.Error != "" {
				cell += " (error)"
			}
			if r.KnownDefect != "" {
				cell += " †"
			}
			if r.Control {
				cell += " ‡"
			}
			ft, _ := faultByID(f)
			fmt.Fprintf(w, " [%s](%s#%s) |", cell, descLink, anchor(ft))
		}
		fmt.Fprintln(w)
	}
}
