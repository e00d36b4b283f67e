package lock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/internal/groupcommit"
	"github.com/redis/go-redis/v9"
)

// Script calls of concurrent callers share pipelines (internal/groupcommit):
// one write and one read of the connection for a batch, in this process
// and in Redis, instead of one each per call. Each script is still its own
// atomic step, and a caller's calls are still sent one after another. A
// lone call is sent as it was, with the caller's context. docs/design.md,
// "Redis pipelines", has the numbers.

// scriptCall is one caller's script call.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
}

// pipeSlots is how many pipelines may be in flight at once; the go-redis
// pool (10 connections per CPU by default) has room for them.
const pipeSlots = 4

// pipeMax bounds a pipeline: large enough for every waiting caller of a
// busy process, small enough that one slow reply does not hold many.
const pipeMax = 128

// pipeStall is how long a pipeline, or a lone call, may go unanswered
// before the next batch goes out beside it (groupcommit.Committer.Stall),
// chosen as etcdkv.Stall was: far above an answer, far below what a held
// call costs the calls behind it. A Redis that hangs (a Cluster master
// frozen by SIGSTOP, a stuck disk) holds a call until its caller's
// deadline, a waiter's budget of seconds: four held at once took every
// slot, and a kept-alive lease on a healthy master, its refresh waiting
// behind them, was lost (docs/design.md, defect 171; on a Cluster each
// master has its committer now, masterPipe). An answer
// takes under a millisecond, a pipeline of 128 scripts a few (8 ms at
// most in BenchmarkAcquireRelease on a loaded machine). A refresh is sent
// at ttl/3 and, unanswered, again at half the time left (Lease.step), so
// it gets a slot within its first attempt for a TTL of 300 ms or more,
// and before its deadline from about 160 ms; etcdkv's 500 ms would cover
// no TTL under 1.5 s, and Redis leases take millisecond TTLs. None can
// cover MinTTL's 10 ms: that would stall calls that are answered. A call
// stalled for nothing costs one more pipeline in flight. At most
// groupcommit.MaxStalled a slot are set aside: with more calls held at
// once (20: waiters on a frozen master's locks, their abandons), later
// calls of that committer wait for its slots again.
const pipeStall = 100 * time.Millisecond

// RedisStats counts the script calls of a RedisStore.
type RedisStats struct {
	Calls     uint64 // script calls sent
	Pipelines uint64 // pipelines of more than one call
	Pipelined uint64 // calls sent in them
}

// Stats returns counters since NewRedisStore.
func (s *RedisStore) Stats() RedisStats {
	return RedisStats{Calls: s.calls.Load(), Pipelines: s.pipelines.Load(), Pipelined: s.pipelined.Load()}
}

func (s *RedisStore) initPipe() { s.setUpPipe(&s.pipe) }

// setUpPipe sets a committer of script calls up.
func (s *RedisStore) setUpPipe(p *groupcommit.Committer[scriptCall]) {
	p.Commit, p.Slots = s.pipeline, pipeSlots
	p.Inline = honoursDeadlines(s.rdb)
	// Stall frees a slot, it does not send its calls again: a stalled
	// call's caller still waits for its one answer.
	p.Stall = pipeStall
	p.SetMaxBatch(pipeMax)
}

// masterPipe is the committer of a call of keys: on a Cluster, that of
// the master that serves their slot as the client last read the layout,
// so that a master that hangs fills no slot of another's. One shared
// committer set aside at most groupcommit.MaxStalled calls a slot, 20 in
// all: with more held on a frozen master (24 waiters on its locks), its
// calls took every slot again, and a kept-alive lease on a healthy master
// was lost (docs/design.md, defect 192). A call whose master is not known
// (the layout not read yet) goes through the shared one; a call sent to
// a master that no longer serves its slot is redirected, as before.
func (s *RedisStore) masterPipe(ctx context.Context, keys []string) *groupcommit.Committer[scriptCall] {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok || len(keys) == 0 {
		return &s.pipe
	}
	node, err := cc.MasterForKey(ctx, keys[0]) // a lock's keys share one slot
	if err != nil {
		return &s.pipe
	}
	addr := node.Options().Addr
	if p, ok := s.masterPipes.Load(addr); ok {
		return p.(*groupcommit.Committer[scriptCall])
	}
	p := new(groupcommit.Committer[scriptCall])
	s.setUpPipe(p)
	got, _ := s.masterPipes.LoadOrStore(addr, p)
	return got.(*groupcommit.Committer[scriptCall])
}

// honoursDeadlines is whether rdb ends a call at its context's deadline
// (ContextTimeoutEnabled). Only then may a lone call run on its caller's
// goroutine; otherwise a caller could not leave a hung Redis before
// go-redis's read timeout.
func honoursDeadlines(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// run runs script, in a pipeline with concurrent calls. If ctx ends first,
// the call may still run; its result is then dropped (every script is
// safe to run again, and the callers free what a lost reply may have
// taken). A call that met a Cluster slot on the move is sent again
// (slotMoving).
func (s *RedisStore) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	for pause := slotPause; ; pause *= 2 {
		cmd := s.run1(ctx, script, keys, args...)
		s.noAnswer(cmd.Err())
		if pause > slotPauseMax || !slotMoving(cmd.Err()) || !clock.Sleep(ctx, pause) {
			return cmd
		}
	}
}

// noAnswer has a Cluster client read the cluster's layout again after a
// call got no answer from Redis (a refused or dropped connection, a
// timeout): its master may have failed over. go-redis v9.23.0 reads the
// layout again on MOVED, and otherwise once a minute
// (ClusterStateReloadInterval), so after a failover it sent the calls of
// the dead master's slots to the dead master for up to a minute (defect
// 106). ReloadState reads it in the background, once at a time, at most
// every 200 ms.
func (s *RedisStore) noAnswer(err error) {
	var reply redis.Error // an answer, redis.Nil included
	if err == nil || errors.As(err, &reply) || errors.Is(err, context.Canceled) {
		return
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
}

// While a Redis Cluster moves a slot, a lock's keys are on two masters
// for a while, and every script call of the lock is answered TRYAGAIN,
// ASK or MOVED: go-redis follows the redirects and tries again, three
// times in all (MaxRedirects), and then passes the last answer on. A
// release or a refresh that failed so would leave the lock to its TTL.
// Redis ran nothing, and every script is safe to run twice anyway, so the
// store sends such a call again, after 10, 20, ... 320 ms (630 ms in all,
// on top of go-redis's), within ctx (defect 104).
const (
	slotPause    = 10 * time.Millisecond
	slotPauseMax = 320 * time.Millisecond
)

// slotMoving is whether err is a Redis Cluster's answer that it ran
// nothing because the call's slot is moving.
func slotMoving(err error) bool {
	if err == nil {
		return false
	}
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	return moved || ask || redis.IsTryAgainError(err)
}

// run1 is one call of run.
func (s *RedisStore) run1(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	v, err := s.masterPipe(ctx, keys).Do(ctx, "", scriptCall{script: script, keys: keys, args: args})
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return v.(*redis.Cmd)
}

// pipeline is the group commit's Commit. A pipeline is bounded by the
// latest deadline of its callers, and by go-redis's read and write
// timeouts; a caller whose own context ends stops waiting for it. Each
// caller is answered as its own answer comes (sendEach): on a Cluster, a
// master that hangs holds its own callers only.
func (s *RedisStore) pipeline(batch []*groupcommit.Request[scriptCall]) {
	s.calls.Add(uint64(len(batch)))
	if len(batch) == 1 {
		c := batch[0].Arg
		batch[0].Done(c.script.Run(batch[0].Ctx, s.rdb, c.keys, c.args...), nil)
		return
	}
	s.pipelines.Add(1)
	s.pipelined.Add(uint64(len(batch)))
	ctx, cancel := batchContext(batch)
	defer cancel()
	calls := make([]scriptCall, len(batch))
	for i, r := range batch {
		calls[i] = r.Arg
	}
	s.sendEach(ctx, calls, func(i int, cmd *redis.Cmd) { batch[i].Done(cmd, nil) })
}

// send sends calls in pipelines and returns their answers, in order.
func (s *RedisStore) send(ctx context.Context, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	s.sendEach(ctx, calls, func(i int, cmd *redis.Cmd) { cmds[i] = cmd })
	return cmds
}

// sendEach sends calls in pipelines and calls answer(i, cmd) once for each
// calls[i], with its answer, possibly from several goroutines at once. It
// returns when every call is answered.
func (s *RedisStore) sendEach(ctx context.Context, calls []scriptCall, answer func(i int, cmd *redis.Cmd)) {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		sendCluster(ctx, cc, calls, answer)
		return
	}
	cmds := make([]*redis.Cmd, len(calls))
	sendOn(ctx, s.rdb, calls, cmds)
	for i, cmd := range cmds {
		answer(i, cmd)
	}
}

// sendOn sends calls in one pipeline of rdb, and those that met a Redis
// not knowing their script (new, restarted or failed over) again, with
// the script, in one more. cmds[i] is set to the answer of calls[i].
func sendOn(ctx context.Context, rdb redis.Cmdable, calls []scriptCall, cmds []*redis.Cmd) {
	p := rdb.Pipeline()
	for i, c := range calls {
		cmds[i] = c.script.EvalSha(ctx, p, c.keys, c.args...)
	}
	_, _ = p.Exec(ctx) // each command carries its own error
	var again redis.Pipeliner
	for i, c := range calls {
		if err := cmds[i].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if again == nil {
				again = rdb.Pipeline()
			}
			cmds[i] = c.script.Eval(ctx, again, c.keys, c.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
}

// sendCluster sends calls to a Redis Cluster: a pipeline to each master,
// on that master's own client, and then each call that met its slot on
// the move (or whose master was not known) alone through the cluster
// client, which follows MOVED and ASK one at a time. Each master's calls
// are answered as its pipeline returns, not once every master's has: a
// master that hangs (frozen, or cut off) must not hold the calls of the
// others, a healthy master's keep-alive refreshes among them, until the
// batch's deadline (docs/design.md, defect 171).
//
// Not the cluster client's pipelines: while a slot moves they can send a
// call to two masters at once (go-redis v9.23.0: a call answered MOVED or
// ASK is queued for the master it names, and queued again with all the
// calls sent to its master when the first of those was answered
// TRYAGAIN). Both answers are then written into one result, a data race,
// and the call's caller may read the refusal of one master while the
// other ran it (docs/design.md, defect 105). A master's own client does
// not follow redirects, so it never sends a call twice.
func sendCluster(ctx context.Context, cc *redis.ClusterClient, calls []scriptCall, answer func(i int, cmd *redis.Cmd)) {
	var wg sync.WaitGroup
	alone := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := calls[i]
			answer(i, c.script.Run(ctx, cc, c.keys, c.args...))
		}()
	}
	parts := make(map[*redis.Client][]int) // where each master's calls are in calls
	for i, c := range calls {
		node, err := cc.MasterForKey(ctx, c.keys[0]) // a lock's keys share one slot
		if err != nil {
			alone(i)
			continue
		}
		parts[node] = append(parts[node], i)
	}
	send := func(node *redis.Client, at []int) {
		part := make([]scriptCall, len(at))
		for j, i := range at {
			part[j] = calls[i]
		}
		got := make([]*redis.Cmd, len(at))
		sendOn(ctx, node, part, got)
		for j, i := range at {
			if slotMoving(got[j].Err()) {
				alone(i)
			} else {
				answer(i, got[j])
			}
		}
	}
	for node, at := range parts {
		if len(parts) == 1 {
			send(node, at) // no goroutine for one master
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(node, at)
		}()
	}
	wg.Wait()
}

// batchContext is a context for a pipeline shared by the batch's callers:
// not cancelled with any one of them, and with the latest of their
// deadlines (none if one has none).
func batchContext(batch []*groupcommit.Request[scriptCall]) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, r := range batch {
		d, ok := r.Ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(r.Ctx))
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].Ctx), latest)
}
