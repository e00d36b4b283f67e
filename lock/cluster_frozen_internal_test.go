package lock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// A pipeline on a Redis Cluster answers each master's calls as that
// master's own pipeline returns: with one master of three frozen
// (SIGSTOP), the calls of the batch to the other two are answered while
// the frozen master still holds its own, which are answered once it
// thaws. Before, every caller of the batch waited for the slowest master,
// up to the batch's deadline (the latest of its callers'): a keep-alive
// refresh sharing a batch with a call to a frozen master was held until
// its lease was lost (docs/design.md, defect 171).
func TestClusterPipelineAnswersEachMasterAsItReturns(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nodes := testenv.StartRedisCluster(t, 3)
	admin := testenv.NewClusterAdmin(t, nodes)
	frozen := nodes[0]
	// Two calls to each master, in one batch, interleaved.
	var calls []scriptCall
	onFrozen := make(map[int]bool)
	echo := redis.NewScript("return ARGV[1]")
	per := make(map[*testenv.RedisProc]int)
	base := testenv.Name(t)
	for i := 0; len(calls) < 2*len(nodes); i++ {
		key := fmt.Sprintf("%s-%d", base, i)
		slot, err := admin.SlotOf(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		owner, err := admin.Owner(ctx, slot)
		if err != nil {
			t.Fatal(err)
		}
		if per[owner] == 2 {
			continue
		}
		per[owner]++
		onFrozen[len(calls)] = owner == frozen
		calls = append(calls, scriptCall{script: echo, keys: []string{key}, args: []any{key}})
	}
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	// Each master's connection dialled and the script loaded.
	sendCluster(ctx, cc, calls, func(i int, cmd *redis.Cmd) {
		if v, err := cmd.Text(); err != nil || v != calls[i].args[0] {
			t.Errorf("call %d before the freeze: %q, %v", i, v, err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	frozen.Stop()
	type answer struct {
		i   int
		cmd *redis.Cmd
	}
	answers := make(chan answer, len(calls))
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		bctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		sendCluster(bctx, cc, calls, func(i int, cmd *redis.Cmd) { answers <- answer{i, cmd} })
	}()
	t.Cleanup(func() { frozen.Cont(); <-sent }) // if the test fails first
	check := func(a answer) {
		t.Helper()
		if v, err := a.cmd.Text(); err != nil || v != calls[a.i].args[0] {
			t.Errorf("call %d: %q, %v; want %q", a.i, v, err, calls[a.i].args[0])
		}
	}
	for range len(calls) - per[frozen] {
		select {
		case a := <-answers:
			if onFrozen[a.i] {
				t.Fatalf("call %d, to the frozen master, answered: %v", a.i, a.cmd.Err())
			}
			check(a)
		case <-time.After(30 * time.Second):
			t.Fatal("the healthy masters' calls were not answered while another master of their batch was frozen")
		}
	}
	frozen.Cont()
	<-sent
	for range per[frozen] {
		a := <-answers
		if !onFrozen[a.i] {
			t.Fatalf("call %d answered twice", a.i)
		}
		check(a)
	}
}
