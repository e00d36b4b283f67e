package httpbench

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// Write prints the report: one row per path, the HTTP÷SDK ratios, the
// bound the HTTP floor sets, the ops/s of each round and the check tokens.
func Write(w io.Writer, rep *Report) error {
	cfg := rep.Config
	fmt.Fprintf(w, "httpbench: store %s (%s); %s, GOMAXPROCS %d, %d CPUs; load average %s\n",
		cfg.Store, rep.Store, runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), rep.Load)
	fmt.Fprintf(w, "TTL %s; %d round(s), the paths in turn, the order rotating; per path: uncontended %d sequential acquire+release on one name in all;\n"+
		"throughput %d goroutines on %d names for %s a round. HTTP: client.Client -> net/http on 127.0.0.1 -> server.New (as fenced serve: a scoped bearer token, metrics on) -> the same lock.Client\n\n",
		cfg.TTL, cfg.Rounds, cfg.Iterations, cfg.Clients, cfg.Clients, cfg.Duration)

	sdk := rep.Find(SDK)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tuncontended p50\tp99\tthroughput ops/s\tcpu/op\terrors\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%s\t%d\t\n", r.Path, benchkit.MS(r.UncP50), benchkit.MS(r.UncP99), r.OpsPerSec(), benchkit.US(r.CPUPerOp()), r.Errors)
	}
	for _, path := range []string{HTTP, Bare} {
		if h := rep.Find(path); h != nil && sdk != nil {
			fmt.Fprintf(tw, "%s÷SDK\t%s\t%s\t%s\t%s\t\t\n", path,
				ratio(float64(h.UncP50), float64(sdk.UncP50)), ratio(float64(h.UncP99), float64(sdk.UncP99)),
				ratio(h.OpsPerSec(), sdk.OpsPerSec()), ratio(float64(h.CPUPerOp()), float64(sdk.CPUPerOp())))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\ncpu/op: CPU time of this whole process (clients, HTTP server, lock client, embedded etcd) per acquire+release in the throughput scenario.")
	fmt.Fprintln(w, "HTTP bare: the HTTP client against a minimal net/http handler making the server's lock.Client calls, and nothing else (no auth, metrics, logging, strict validation).")
	if err := writeSteps(w, rep); err != nil {
		return err
	}
	writeLoad(w, rep)
	if f := rep.Find(Floor); f != nil && sdk != nil && f.CPUPerOp() > 0 && sdk.OpsPerSec() > 0 {
		// Any pair over HTTP costs at least the SDK's work plus the
		// floor's: with every CPU busy, no more pairs a second than this.
		limit := float64(runtime.NumCPU()) / (sdk.CPUPerOp() + f.CPUPerOp()).Seconds()
		fmt.Fprintf(w, "HTTP floor: the HTTP client against canned answers (net/http, JSON, no auth, metrics or store), %s CPU per pair.\n"+
			"Bound for any request-per-operation HTTP API here: %d CPUs ÷ (SDK %s + floor %s) = %.0f pairs/s, %s the SDK's throughput.\n",
			benchkit.US(f.CPUPerOp()), runtime.NumCPU(), benchkit.US(sdk.CPUPerOp()), benchkit.US(f.CPUPerOp()), limit, ratio(limit, sdk.OpsPerSec()))
	}
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%s throughput ops/s by round:", r.Path)
		for _, v := range r.RoundOpsRate {
			fmt.Fprintf(w, " %.0f", v)
		}
		fmt.Fprintln(w)
	}
	toks := make([]string, len(rep.Checks))
	for i, c := range rep.Checks {
		toks[i] = fmt.Sprintf("%s %d", c.Path, c.Token)
	}
	fmt.Fprintf(w, "check, one name, sequential, the paths alternating: tokens %s\n", strings.Join(toks, ", "))
	for _, r := range rep.Results {
		if r.FirstErr != nil {
			fmt.Fprintf(w, "%s: %d errors, the first: %v\n", r.Path, r.Errors, r.FirstErr)
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}

// writeSteps prints where the uncontended requests' time went, and what
// the HTTP path adds to the SDK's per pair.
func writeSteps(w io.Writer, rep *Report) error {
	fmt.Fprintln(w, "\nuncontended, each request of the pairs (p50s; the parts' need not add up to the call's):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\trequest\tcall\tto server\tin server\tback\t")
	for _, r := range rep.Results {
		for _, st := range []struct {
			name string
			s    Step
		}{{"acquire", r.Acquire}, {"release", r.Release}} {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Path, st.name, benchkit.US(st.s.Call),
				benchkit.US(st.s.ToServer), benchkit.US(st.s.InServer), benchkit.US(st.s.Back))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "to server: from the call to the server's handler starting; in server: the handler; back: from its end to the call's return.")
	sdk, h, bare := rep.Find(SDK), rep.Find(HTTP), rep.Find(Bare)
	if sdk == nil || h == nil || bare == nil || h.Acquire.InServer == 0 || bare.Acquire.InServer == 0 {
		return nil
	}
	// What a server spends beyond the SDK's own calls, both requests.
	beyond := func(r *Result) time.Duration {
		return r.Acquire.InServer - sdk.Acquire.Call + r.Release.InServer - sdk.Release.Call
	}
	transport := h.Acquire.ToServer + h.Acquire.Back + h.Release.ToServer + h.Release.Back
	fmt.Fprintf(w, "HTTP above the SDK, per pair: the transport (to server and back, both requests) %s; in the server beyond the SDK's calls %s, "+
		"against %s in the minimal handler (HTTP bare): fenced's server itself %s.\n",
		benchkit.US(transport), signedUS(beyond(h)), signedUS(beyond(bare)), signedUS(beyond(h)-beyond(bare)))
	return nil
}

// writeLoad prints where a pair's time went in the throughput scenario:
// in the server's handlers, and on the way to them and back.
func writeLoad(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "\nunder load (the throughput scenario, %d goroutines), the mean pair: in the handlers (both requests) and on the way to the server and back:\n", rep.Config.Clients)
	for _, r := range rep.Results {
		if r.Ops == 0 {
			continue
		}
		pair := r.PairTime / time.Duration(r.Ops)
		if r.HandlerTime == 0 {
			fmt.Fprintf(w, "  %s: %s\n", r.Path, benchkit.MS(pair))
			continue
		}
		in := r.HandlerTime / time.Duration(r.Ops)
		fmt.Fprintf(w, "  %s: %s, in the handlers %s, on the way %s\n", r.Path, benchkit.MS(pair), benchkit.MS(in), benchkit.MS(pair-in))
	}
}

// signedUS is d in whole microseconds with its sign.
func signedUS(d time.Duration) string {
	return fmt.Sprintf("%+.0fµs", float64(d)/float64(time.Microsecond))
}

// ratio is v ÷ ref, "-" without a reference.
func ratio(v, ref float64) string {
	if ref == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", v/ref)
}
