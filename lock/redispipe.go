package lock

import (
	"context"
	"time"

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
// taken).
func (s *RedisStore) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
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
	p := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, r := range batch {
		cmds[i] = r.Arg.script.EvalSha(ctx, p, r.Arg.keys, r.Arg.args...)
	}
	_, _ = p.Exec(ctx) // each command carries its own error
	// Calls that met a Redis not knowing their script (new, restarted or
	// failed over) go again, with the script itself, in one more pipeline.
	var again redis.Pipeliner
	for i, r := range batch {
		if err := cmds[i].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if again == nil {
				again = s.rdb.Pipeline()
			}
			cmds[i] = r.Arg.script.Eval(ctx, again, r.Arg.keys, r.Arg.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for i, r := range batch {
		r.Done(cmds[i], nil)
	}
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
