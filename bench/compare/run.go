package compare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Config is one run of the comparison.
type Config struct {
	DSN     string   // Postgres
	Schemes []string // ids; empty: all
	Faults  []string // ids; empty: all
	Warm    int      // transfers per worker before the fault (the acquisitions per second come from these)
	After   int      // transfers per worker after it
	Short   bool     // shorter TTLs and deadlines
	Seed    uint64
	// Parallel runs this many scenarios at once (each has its own
	// processes, ports and schema). The safety checks do not depend on
	// timing; acquisitions per second do, so the full run uses 1.
	Parallel int
	Log      io.Writer // progress
	Verbose  bool      // workers' logs too
	// Exe is the program to re-execute as workers and etcd members; empty:
	// this one (os.Executable). Its main must call ChildMain when IsChild.
	Exe string
}

// DefaultConfig is the full run; ShortConfig the quick one of CI.
func DefaultConfig() Config { return Config{Warm: 20, After: 4, Parallel: 1} }

// ShortConfig runs every fault once with small counts.
// Under each fault it runs fenced's stores and the one peer that shows
// the fault best (shortPeers), two scenarios at a time.
func ShortConfig() Config { return Config{Warm: 3, After: 1, Short: true, Parallel: 2} }

// shortPeers are the peers a short run keeps, by fault: enough to show
// that each fault bites.
var shortPeers = map[string][]string{
	FPause: {Redislock, EtcdMutex}, FFailover: {RedisIncr}, FRestart: {RedisIncr}, FClockJump: {Redislock},
	FLeaderKill: {EtcdMutex}, FLeaderFreeze: {EtcdMutex}, FPartRedis: {Redislock}, FLatRedis: {Redislock},
	FPartEtcd: {EtcdMutex}, FLatEtcd: {EtcdMutex}, FRestoreOther: {EtcdMutexRev},
}

// Result is one scheme under one fault.
type Result struct {
	Scheme string `json:"scheme"`
	Fault  string `json:"fault"`
	counts
	LostUpdates  int      `json:"lost_updates"`
	AcqPerSec    float64  `json:"acquisitions_per_second"`
	Register     string   `json:"register_linearizable"`        // yes, no, unknown
	Mutex        string   `json:"mutex_linearizable,omitempty"` // "" for schemes without tokens
	Linearizable string   `json:"linearizable"`                 // yes when both are
	Acquisitions int      `json:"acquisitions"`
	FailedAcq    int      `json:"failed_acquisitions"`
	Audit        audit    `json:"ledger"`
	Notes        []string `json:"notes,omitempty"`
	Error        string   `json:"error,omitempty"`
	Seconds      float64  `json:"seconds"`
	Fenced       bool     `json:"fenced"`
	Control      bool     `json:"control,omitempty"`
	// Gate is why this result fails the run ("" when it passes or the gate
	// does not apply).
	Gate string `json:"gate,omitempty"`
	// KnownDefect names a fenced defect reported and not fixed yet, which
	// this scenario reproduces; the gate then expects the violation.
	KnownDefect string `json:"known_defect,omitempty"`

	history history
	marks   map[string]int64
}

// Report is a whole run.
type Report struct {
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Short    bool      `json:"short"`
	Loadavg  string    `json:"loadavg"`
	Results  []Result  `json:"results"`
	Failures []string  `json:"failures,omitempty"` // the gate: empty when fenced held everywhere
}

// Run runs every selected scheme under every selected fault it applies to,
// each on a fresh setup, and checks each history.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Seed == 0 {
		cfg.Seed = mrand.Uint64()
	}
	exe := cfg.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	var ss []scheme
	for _, s := range schemes {
		if len(cfg.Schemes) == 0 || contains(cfg.Schemes, s.ID) {
			ss = append(ss, s)
		}
	}
	var fs []fault
	for _, f := range faults {
		if len(cfg.Faults) == 0 || contains(cfg.Faults, f.ID) {
			fs = append(fs, f)
		}
	}
	for _, id := range cfg.Schemes {
		if _, ok := schemeByID(id); !ok {
			return nil, fmt.Errorf("no scheme %q; the schemes are %s", id, strings.Join(SchemeIDs(), ", "))
		}
	}
	for _, id := range cfg.Faults {
		if _, ok := faultByID(id); !ok {
			return nil, fmt.Errorf("no fault %q; the faults are %s", id, strings.Join(FaultIDs(), ", "))
		}
	}
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("Postgres at %s: %w (start it, or set FENCED_TEST_POSTGRES)", cfg.DSN, err)
	}
	defer pool.Close()
	var b [4]byte
	_, _ = rand.Read(b[:])
	runID := hex.EncodeToString(b[:])
	base, err := os.MkdirTemp("", "fenced-compare-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)

	rep := &Report{Started: time.Now(), Short: cfg.Short, Loadavg: loadavg()}
	var cells []*cell
	for _, f := range fs {
		for _, s := range ss {
			if !f.applies(s) || cfg.Short && !s.Fenced && !contains(shortPeers[f.ID], s.ID) && len(cfg.Schemes) == 0 {
				continue
			}
			n := len(cells) + 1
			cells = append(cells, &cell{cfg: cfg, s: s, f: f, exe: exe, dir: fmt.Sprintf("%s/c%d", base, n), pool: pool,
				schema: fmt.Sprintf("cmp_%s_%d", runID, n), lock: fmt.Sprintf("%s-%s-%d", resource, runID, n),
				ttl: s.ttl(cfg.Short), log: cfg.Log, rng: mrand.New(mrand.NewPCG(cfg.Seed, uint64(n)))})
		}
	}
	rep.Results = make([]Result, len(cells))
	par := max(cfg.Parallel, 1)
	next := make(chan int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range par {
		wg.Go(func() {
			for i := range next {
				c := cells[i]
				r := runCell(ctx, c)
				mu.Lock()
				rep.Results[i] = r
				fmt.Fprintf(cfg.Log, "%-22s %-16s %s\n", c.f.ID, c.s.ID, r.line())
				mu.Unlock()
			}
		})
	}
	for i := range cells {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	for _, r := range rep.Results {
		if r.Gate != "" {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s under %s: %s", r.Scheme, r.Fault, r.Gate))
		}
	}
	return rep, nil
}

func runCell(ctx context.Context, c *cell) Result {
	start := time.Now()
	r := Result{Scheme: c.s.ID, Fault: c.f.ID, Fenced: c.s.Fenced, Control: c.f.control}
	err := c.setup(ctx)
	if err == nil {
		err = c.run(ctx)
	}
	end := time.Now().UnixNano()
	// Stop the workers first: every report is in, and no write is left
	// in flight when the ledger is read.
	for _, w := range c.ws {
		w.stop(3 * time.Second)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	a, aerr := checkLedger(actx, c.pool, c.schema)
	cancel()
	c.teardown()
	if err = errors.Join(err, aerr); err != nil {
		r.Error = err.Error()
	}
	tokens := c.s.Token != ""
	h := buildHistory(c.j.snapshot(), a, end)
	r.history = h
	if c.cfg.Verbose { // the history, for a reader who doubts a count
		for _, g := range h.Grants {
			fmt.Fprintf(c.log, "      grant %s tok %d inv %d ok %d end %d\n", g.Holder, g.Token, g.Inv/1e6%100000, g.OK/1e6%100000, g.End/1e6%100000)
		}
		for _, a := range h.Attempts {
			fmt.Fprintf(c.log, "      %s %s %s tok %d %s hi %d commit %d\n", a.Kind, a.Holder, a.Transfer, a.Token, a.Outcome, a.Highest, a.Commit)
		}
	}
	r.counts = check(h, tokens)
	r.Audit = a
	r.LostUpdates = a.LostUpdates
	if !a.Conserved || !a.ReplayMatches {
		if r.LostUpdates == 0 {
			r.LostUpdates = 1 // the invariant broke without a transfer to blame
		}
	}
	r.Register, r.Mutex = linearizable(h, tokens)
	r.Linearizable = r.Register
	if r.Mutex != "" && r.Mutex != "yes" {
		r.Linearizable = r.Mutex
	}
	r.Acquisitions, r.FailedAcq = len(h.Grants), h.Failed
	if w0, w1 := c.marks["warm"], c.marks["warm-end"]; w1 > w0 {
		k := 0
		for _, g := range h.Grants {
			if g.OK >= w0 && g.OK <= w1 {
				k++
			}
		}
		r.AcqPerSec = float64(k) / (float64(w1-w0) / 1e9)
	}
	r.Notes, r.marks = c.notes, c.marks
	r.Seconds = time.Since(start).Seconds()
	r.gate()
	return r
}

// gate applies the rule of CI to a fenced result: no stale write admitted,
// no lost update, no repeated token, both linearizability checks pass, and
// the scenario ran to its end. Control scenarios are exempt; a known,
// reported defect is expected to show, and must be removed from
// knownDefects once it no longer does.
func (r *Result) gate() {
	if !r.Fenced || r.Control {
		return
	}
	var why []string
	if r.Error != "" {
		why = append(why, "the scenario failed: "+r.Error)
	}
	if r.StaleAdmitted > 0 {
		why = append(why, fmt.Sprintf("%d stale write(s) admitted", r.StaleAdmitted))
	}
	if r.LostUpdates > 0 {
		why = append(why, fmt.Sprintf("%d lost update(s)", r.LostUpdates))
	}
	if r.TokensBad > 0 {
		why = append(why, fmt.Sprintf("%d token(s) repeated or not above an earlier grant's", r.TokensBad))
	}
	if r.Register != "yes" || r.Mutex != "yes" {
		why = append(why, fmt.Sprintf("linearizable: register %s, mutex %s", r.Register, r.Mutex))
	}
	if d, ok := knownDefects[r.Scheme+" "+r.Fault]; ok {
		r.KnownDefect = d
		if len(why) == 0 {
			r.Gate = "known defect no longer reproduces (fixed?): remove it from knownDefects: " + d
		}
		return
	}
	r.Gate = strings.Join(why, "; ")
}

// knownDefects are fenced defects this harness found and reported, which
// are not fixed yet: the scenario is kept as their regression test, and
// the gate asks for an entry's removal once it no longer reproduces. The
// one found so far (a running process noticed a restore only through its
// own tokens) is fixed: sequencer.Issuer follows every process's tokens.
var knownDefects = map[string]string{}

func (r Result) line() string {
	if r.Error != "" && r.Acquisitions == 0 {
		return "ERROR " + r.Error
	}
	s := fmt.Sprintf("overlap %d  stale admitted %d  stale rejected %d  current rejected %d  lost %d  tokens bad %d  lin %s  %.0f acq/s  %.1fs",
		r.Overlaps, r.StaleAdmitted, r.StaleRejected, r.CurrentRejected, r.LostUpdates, r.TokensBad, r.Linearizable, r.AcqPerSec, r.Seconds)
	if r.Error != "" {
		s += "  ERROR " + r.Error
	}
	if r.Gate != "" {
		s += "  GATE: " + r.Gate
	}
	return s
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// SchemeIDs and FaultIDs list what Config may name.
func SchemeIDs() []string {
	var ids []string
	for _, s := range schemes {
		ids = append(ids, s.ID)
	}
	return ids
}

func FaultIDs() []string {
	var ids []string
	for _, f := range faults {
		ids = append(ids, f.ID)
	}
	return ids
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}
