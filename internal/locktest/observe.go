package locktest

import (
	"fmt"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// ObserveEachLinkHeld holds the observer's link to each etcd member in
// turn (links, from testenv.ClusterClientProxied), elects a new leader of
// name through candidates meanwhile, and fails the test unless obs, whose
// first leader was read already, shows it within 5 s while the link is
// still held (docs/design.md, defect 194). during, if not nil, runs once
// the link is held and returns what undoes it (a member cut from its
// peers, say).
func ObserveEachLinkHeld(t *testing.T, candidates *lock.Client, obs <-chan lock.Leader, name string, links []*faultproxy.Proxy, during func(i int) (undo func())) {
	t.Helper()
	ctx := t.Context()
	const within = 5 * time.Second
	var lead *lock.Lease
	shown := lock.Leader{Name: name}
	for i, link := range links {
		if lead != nil {
			if err := lead.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		link.Hold(true)
		undo := func() {}
		if during != nil {
			undo = during(i)
		}
		v := fmt.Sprintf("held%d", i)
		var err error
		if lead, err = candidates.Elect(ctx, name, v, 5*time.Second, lock.WithWait(30*time.Second)); err != nil {
			t.Fatal(err)
		}
		want := lock.Leader{Name: name, Leading: true, Value: v, Token: lead.Token()}
		t0 := time.Now()
		l, ok := testenv.NextWithin(obs, within, func(l lock.Leader) bool { return l == want })
		if l.Name != "" {
			shown = l
		}
		if !ok {
			t.Errorf("link to member %d held: %s after %q was elected (term %d), the observer still shows %+v", i, within, v, lead.Token(), shown)
		} else {
			t.Logf("link to member %d held: the new leader shown after %s", i, time.Since(t0).Round(time.Millisecond))
		}
		link.Hold(false)
		undo()
		if !ok {
			l, _ := testenv.NextWithin(obs, 15*time.Second, func(l lock.Leader) bool { return l == want })
			t.Logf("  once the link was let through: %+v", l)
		}
	}
	if err := lead.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
