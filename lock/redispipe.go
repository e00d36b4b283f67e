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

func (s *RedisStore) initPipe() {
	s.pipe.Commit, s.pipe.Slots = s.pipeline, pipeSlots
	s.pipe.Inline = honoursDeadlines(s.rdb)
	s.pipe.SetMaxBatch(pipeMax)
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
	v, err := s.pipe.Do(ctx, "", scriptCall{script: script, keys: keys, args: args})
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return v.(*redis.Cmd)
}

// pipeline is the group commit's Commit. A pipeline is bounded by the
// latest deadline of its callers, and by go-redis's read and write
// timeouts; a caller whose own context ends stops waiting for it.
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
	cmds := s.send(ctx, calls)
	for i, r := range batch {
		r.Done(cmds[i], nil)
	}
}

// send sends calls in pipelines and returns their answers, in order.
func (s *RedisStore) send(ctx context.Context, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		sendCluster(ctx, cc, calls, cmds)
	} else {
		sendOn(ctx, s.rdb, calls, cmds)
	}
	return cmds
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
// client, which follows MOVED and ASK one at a time.
//
// Not the cluster client's pipelines: while a slot moves they can send a
// call to two masters at once (go-redis v9.23.0: a call answered MOVED or
// ASK is queued for the master it names, and queued again with all the
// calls sent to its master when the first of those was answered
// TRYAGAIN). Both answers are then written into one result, a data race,
// and the call's caller may read the refusal of one master while the
// other ran it (docs/design.md, defect 105). A master's own client does
// not follow redirects, so it never sends a call twice.
func sendCluster(ctx context.Context, cc *redis.ClusterClient, calls []scriptCall, cmds []*redis.Cmd) {
	type part struct {
		calls []scriptCall
		at    []int // where each call is in calls
	}
	parts := make(map[*redis.Client]*part)
	for i, c := range calls {
		node, err := cc.MasterForKey(ctx, c.keys[0]) // a lock's keys share one slot
		if err != nil {
			continue // sent alone below
		}
		p := parts[node]
		if p == nil {
			p = &part{}
			parts[node] = p
		}
		p.calls, p.at = append(p.calls, c), append(p.at, i)
	}
	send := func(node *redis.Client, p *part) {
		got := make([]*redis.Cmd, len(p.calls))
		sendOn(ctx, node, p.calls, got)
		for j, i := range p.at {
			cmds[i] = got[j]
		}
	}
	var wg sync.WaitGroup
	for node, p := range parts {
		if len(parts) == 1 {
			send(node, p) // no goroutine for one master
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(node, p)
		}()
	}
	wg.Wait()
	for i, c := range calls {
		if cmds[i] == nil || slotMoving(cmds[i].Err()) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmds[i] = c.script.Run(ctx, cc, c.keys, c.args...)
			}()
		}
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
