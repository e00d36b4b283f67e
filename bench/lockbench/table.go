package lockbench

import (
	"fmt"
	"io"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// Write prints the report: the figures with throughput and handoff ratios
// and CPU per operation, a table of every figure's ratios, and notes on how
// each implementation waits.
func Write(w io.Writer, rep *Report) error {
	cfg := rep.Config
	fsync := "fsync ON"
	if cfg.NoFsync {
		fsync = "fsync OFF (UnsafeNoFsync: not durable, not honest for production)"
	}
	fmt.Fprintf(w, "lockbench: embedded etcd (1 member, %s), %s at %s; %s, GOMAXPROCS %d, %d CPUs\n",
		fsync, rep.Redis, cfg.RedisAddr, runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU())
	fmt.Fprintf(w, "load average %s\n", rep.Load)
	fmt.Fprintf(w, "TTL %s; %d round(s), each implementation in turn, the order rotating; per implementation: uncontended %d sequential acquire+release on one name in all;\n"+
		"throughput %d clients on %d names for %s a round; hot name %d contenders for %s a round\n",
		cfg.TTL, cfg.Rounds, cfg.Iterations, cfg.Clients, cfg.Clients, cfg.Duration, cfg.Contenders, cfg.Duration)
	fmt.Fprintf(w, "baselines, one client: etcd Put p50 %s p99 %s; Redis PING p50 %s p99 %s\n\n",
		benchkit.MS(rep.EtcdPutP50), benchkit.MS(rep.EtcdPutP99), benchkit.MS(rep.RedisP50), benchkit.MS(rep.RedisP99))

	etcd, rl := rep.find(EtcdMutex), rep.find(RedisLock)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "impl\tuncontended p50\tp99\t−Put\tthroughput ops/s\t×etcdMutex\t×redislock\traft/op\tcpu/op proc\tredis\thandoffs/s\t×etcdMutex\t×redislock\t→other\tgap p50\t−Put\tgap p99\tmax holders\terrors\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.0f\t%s\t%s\t%.2f\t%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t\n",
			r.Impl, benchkit.MS(r.UncP50), benchkit.MS(r.UncP99), overPut(r.UncP50, r.PutP50),
			r.OpsPerSec(), ratio(r.OpsPerSec(), etcd, Result.OpsPerSec), ratio(r.OpsPerSec(), rl, Result.OpsPerSec),
			r.RaftWritesPerOp(), benchkit.US(r.ProcCPUPerOp()), benchkit.US(r.RedisCPUPerOp()),
			r.HandoffsPerSec(), ratio(r.HandoffsPerSec(), etcd, Result.HandoffsPerSec), ratio(r.HandoffsPerSec(), rl, Result.HandoffsPerSec),
			pct(r.ToOther, r.Gaps), benchkit.MS(r.GapP50), overPut(r.GapP50, r.PutP50), benchkit.MS(r.GapP99), r.MaxHolders, r.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "−Put: p50 less the p50 of an etcd Put made after each uncontended pair (the floor under the same conditions)")

	fmt.Fprintln(w, "\nevery figure as a ratio, value ÷ etcd Mutex / value ÷ redislock (latency and gap: lower is better; ops/s and handoffs/s: higher is better)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "impl\tuncontended p50\tp99\tthroughput ops/s\thandoffs/s\tgap p50\tgap p99\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Impl,
			ratios(r, etcd, rl, func(x Result) float64 { return float64(x.UncP50) }),
			ratios(r, etcd, rl, func(x Result) float64 { return float64(x.UncP99) }),
			ratios(r, etcd, rl, Result.OpsPerSec),
			ratios(r, etcd, rl, Result.HandoffsPerSec),
			ratios(r, etcd, rl, func(x Result) float64 { return float64(x.GapP50) }),
			ratios(r, etcd, rl, func(x Result) float64 { return float64(x.GapP99) }))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nfairness on the hot name (%d contenders): how long each acquisition waited, and the share that went to another contender\n", cfg.Contenders)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "impl\twait p50\twait p99\twait max\tmax÷p50\t→other\tgap p50\thandoffs/s\texpiry handover p50\tp99\t")
	for _, r := range rep.Results {
		spread := "-"
		if r.WaitP50 > 0 {
			spread = fmt.Sprintf("%.0f×", float64(r.WaitMax)/float64(r.WaitP50))
		}
		hp50, hp99 := "-", "-"
		if r.Handovers > 0 {
			hp50, hp99 = benchkit.MS(r.HandoverP50), benchkit.MS(r.HandoverP99)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\t%s\t\n", r.Impl, benchkit.MS(r.WaitP50), benchkit.MS(r.WaitP99), benchkit.MS(r.WaitMax),
			spread, pct(r.ToOther, r.Gaps), benchkit.MS(r.GapP50), r.HandoffsPerSec(), hp50, hp99)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nhow each waits for a held lock:")
	tw = tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "  %s\t%s\n", r.Impl, r.Wait)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "handoffs/s: acquisitions of the hot name per second; →other: the share of them by another contender than the last holder;")
	fmt.Fprintln(w, "gap: from the holder starting its release to the next holder's Lock returning.")
	if cfg.Expirers > 0 {
		fmt.Fprintf(w, "expiry handover: %d holders at once take a lock with TTL %s, not kept alive, and walk away; a waiter each asks at once; from the TTL's end to the waiter's Lock returning.\n",
			cfg.Expirers, cfg.ExpiryTTL)
	}
	fmt.Fprintln(w, "raft/op: how far etcd's Raft index moved per acquire+release in the throughput scenario (every consensus write: Txn, Put, lease grant, revoke).")
	fmt.Fprintln(w, "cpu/op: CPU time per acquire+release in the throughput scenario, of this process (clients and embedded etcd) and of the Redis server (all its clients).")
	for _, r := range rep.Results {
		if len(r.RoundOpsRate) > 1 {
			fmt.Fprintf(w, "%s throughput ops/s by round:", r.Impl)
			for _, v := range r.RoundOpsRate {
				fmt.Fprintf(w, " %.0f", v)
			}
			fmt.Fprintln(w)
		}
	}
	for _, r := range rep.Results {
		if r.Txns > 0 {
			fmt.Fprintf(w, "%s throughput scenario: %d %s in %d etcd txns, %.2f per txn (group commit)\n",
				r.Impl, r.Batched, r.BatchItems, r.Txns, float64(r.Batched)/float64(r.Txns))
		}
		if r.FirstErr != nil {
			fmt.Fprintf(w, "%s: %d errors, the first: %v\n", r.Impl, r.Errors, r.FirstErr)
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}

func (rep *Report) find(name string) *Result {
	for i := range rep.Results {
		if rep.Results[i].Impl == name {
			return &rep.Results[i]
		}
	}
	return nil
}

func pct(n, of int) string {
	if of <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(n)/float64(of))
}

// ratio is v ÷ ref's figure, "-" when there is no reference.
func ratio(v float64, ref *Result, f func(Result) float64) string {
	if ref == nil || f(*ref) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", v/f(*ref))
}

func ratios(r Result, etcd, rl *Result, f func(Result) float64) string {
	return ratio(f(r), etcd, f) + " / " + ratio(f(r), rl, f)
}

// overPut is how far d is above the Put's p50, "-" when either is unknown.
func overPut(d, put time.Duration) string {
	if d == 0 || put == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.2fms", float64(d-put)/float64(time.Millisecond))
}
