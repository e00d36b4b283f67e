package sequencer_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/freeport"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLeaderStopMidRun runs grants against a three-member cluster, stops the
// leader in the middle, and checks that no grant broke the order of tokens
// per name or repeated a token, and that grants go on after the failover.
func TestLeaderStopMidRun(t *testing.T) {
	t.Parallel()
	members := testenv.EtcdCluster(t, 3)
	cli := testenv.ClusterClient(t, members)
	s := newSeq(t, cli, sequencer.WithCommitTimeout(3*time.Second))

	var clock atomic.Uint64
	var mu sync.Mutex
	var hist []grant
	var afterStop atomic.Int64
	stopped := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				name := fmt.Sprint("ln-", w%4)
				b := clock.Add(1)
				tok, err := s.Next(ctx, name)
				e := clock.Add(1)
				if err != nil {
					continue // the failover makes some grants fail; they are not in the history
				}
				mu.Lock()
				hist = append(hist, grant{name, tok, b, e})
				mu.Unlock()
				select {
				case <-stopped:
					afterStop.Add(1)
				default:
				}
			}
		}(w)
	}
	testenv.WaitUntil(t, 60*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(hist) >= 300 })
	leader := testenv.Leader(members)
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Close()
	close(stopped)
	testenv.WaitUntil(t, 60*time.Second, func() bool { return afterStop.Load() >= 300 })
	cancel()
	wg.Wait()
	checkOrder(t, hist)
	t.Logf("%d grants, %d after the leader %s stopped", len(hist), afterStop.Load(), leader.Name())
}

// TestRaiseFloorAfterSnapshotRestore: issue tokens, snapshot, issue more,
// restore the snapshot into a new member, and check that without the step
// tokens would go back, and with it the next token exceeds all before.
func TestRaiseFloorAfterSnapshotRestore(t *testing.T) {
	e, cli := testenv.Etcd(t)
	s := newSeq(t, cli)
	ctx := t.Context()
	var max fence.Token
	issue := func(s sequencer.Sequencer, n int) {
		for i := 0; i < n; i++ {
			tok, err := s.Next(ctx, fmt.Sprint("r-", i%3))
			if err != nil {
				t.Fatal(err)
			}
			if tok > max {
				max = tok
			}
		}
	}
	issue(s, 20)
	snap := testenv.SaveEtcdSnapshot(t, e)
	issue(s, 50)
	s.Close()
	e.Close()

	e2 := testenv.RestoreEtcd(t, snap)
	cli2, err := e2.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli2.Close()

	f, err := sequencer.ReadFloor(ctx, cli2, "")
	if err != nil {
		t.Fatal(err)
	}
	if f.Next > max {
		t.Fatalf("restored cluster would issue %d > %d without the step: the test does not exercise a restore", f.Next, max)
	}
	nf, err := sequencer.RaiseFloor(ctx, cli2, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	s2 := newSeq(t, cli2)
	for i := 0; i < 3; i++ {
		tok, err := s2.Next(ctx, fmt.Sprint("r-", i))
		if err != nil {
			t.Fatal(err)
		}
		if tok <= max || tok < nf.Next {
			t.Fatalf("token %d after the step, want > %d (highest before) and >= %d", tok, max, nf.Next)
		}
	}
}

// TestRaiseFloorNewClusterWithMin replaces the cluster by a new empty one and
// raises the floor to a given minimum far above the clock.
func TestRaiseFloorNewClusterWithMin(t *testing.T) {
	_, cli := testenv.Etcd(t)
	ctx := t.Context()
	min := fence.Token(uint64(time.Now().UnixMicro()) + 1e12)
	if _, err := sequencer.RaiseFloor(ctx, cli, "", min); err != nil {
		t.Fatal(err)
	}
	s := newSeq(t, cli)
	prev, err := s.Next(ctx, "a")
	if err != nil || prev <= min {
		t.Fatalf("first token %d, %v; want > %d", prev, err, min)
	}
	// Raising again with a lower minimum never lowers tokens.
	if _, err := sequencer.RaiseFloor(ctx, cli, "", 5); err != nil {
		t.Fatal(err)
	}
	tok, err := s.Next(ctx, "a")
	if err != nil || tok <= prev {
		t.Fatalf("token after a lower raise: %d, %v; want > %d", tok, err, prev)
	}
}

func TestEnsureFloorOnlyOnANewCluster(t *testing.T) {
	_, cli := testenv.Etcd(t)
	ctx := t.Context()
	before := fence.Token(time.Now().UnixMicro())
	f, raised, err := sequencer.EnsureFloor(ctx, cli, "")
	if err != nil || !raised || f.Next <= before {
		t.Fatalf("first EnsureFloor: %+v raised=%v %v; want a floor above %d", f, raised, err, before)
	}
	f2, raised, err := sequencer.EnsureFloor(ctx, cli, "")
	if err != nil || raised || f2.Offset != f.Offset {
		t.Fatalf("second EnsureFloor: %+v raised=%v %v; want the floor left alone", f2, raised, err)
	}
	s := newSeq(t, cli)
	tok, err := s.Next(ctx, "n")
	if err != nil || tok < f.Next {
		t.Fatalf("token %d, %v; want >= %d", tok, err, f.Next)
	}
}

// TestEnsureFloorConcurrently: nodes of a new cluster all ensure the floor
// at start; exactly one raises it.
func TestEnsureFloorConcurrently(t *testing.T) {
	_, cli := testenv.Etcd(t)
	var raised atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, r, err := sequencer.EnsureFloor(context.Background(), cli, ""); err != nil {
				t.Error(err)
			} else if r {
				raised.Add(1)
			}
		}()
	}
	wg.Wait()
	if raised.Load() != 1 {
		t.Fatalf("%d callers raised the floor, want 1", raised.Load())
	}
}

// TestSequencerNoticesEtcdWentBack: a running sequencer whose etcd is
// restored from an older snapshot without RaiseFloor must not hand out a
// token at or below one it issued before. It raises the floor itself.
func TestSequencerNoticesEtcdWentBack(t *testing.T) {
	e, direct := testenv.Etcd(t)
	ctx := t.Context()
	p, cli := testenv.EtcdThroughProxy(t, e)
	s := newSeq(t, cli)
	// other issues tokens before the snapshot only: it must notice the
	// restore through the tokens the others issued (it follows them).
	other := newSeq(t, testenv.EtcdClient(t, p.Addr()))
	if _, err := other.Next(ctx, "o"); err != nil {
		t.Fatal(err)
	}
	var max fence.Token
	issue := func(n int) {
		for i := 0; i < n; i++ {
			tok, err := s.Next(ctx, fmt.Sprint("r-", i%3))
			if err != nil {
				t.Fatal(err)
			}
			if tok <= max {
				t.Fatalf("token %d after %d", tok, max)
			}
			max = tok
		}
	}
	issue(20)
	snap := testenv.SaveEtcdSnapshot(t, e)
	issue(50)
	testenv.StopEtcdBehind(p, e, direct)

	e2 := testenv.RestoreEtcd(t, snap)
	if f, err := sequencer.ReadFloor(ctx, mustClient(t, e2), ""); err != nil || f.Next > max {
		t.Fatalf("the restored cluster would issue %d (%v), above %d anyway: the test does not exercise a restore", f.Next, err, max)
	}
	testenv.PointAt(p, e2) // the sequencers' connections now reach the restored member
	tok, err := other.Next(ctx, "o")
	if err != nil {
		t.Fatal(err)
	}
	if tok <= max {
		t.Fatalf("a process that issued no token since the snapshot got %d from the restored cluster, at or below %d issued by another", tok, max)
	}
	max = tok
	for i := 0; i < 3; i++ {
		tok, err := s.Next(ctx, fmt.Sprint("r-", i))
		if err != nil {
			t.Fatal(err)
		}
		if tok <= max {
			t.Fatalf("token %d from the restored cluster, at or below %d issued before", tok, max)
		}
		max = tok
	}
	// Their watches end before the member closes.
	s.Close()
	other.Close()
}

func mustClient(t *testing.T, e *sequencer.Embedded) *clientv3.Client {
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A member of three whose peers never come up gives up at its start
// timeout, having said every few seconds what it waits for. It used to
// say nothing and never return: etcd's Close, on the way out, waits for
// the member to serve clients, which it never did (nor did SIGTERM end
// fenced serve then).
func TestMemberWithoutItsPeersGivesUp(t *testing.T) {
	t.Parallel()
	urls := make([]string, 4)
	for i := range urls {
		u, err := freeport.URL()
		if err != nil {
			t.Fatal(err)
		}
		urls[i] = u
	}
	var logs testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := sequencer.StartEmbedded(context.Background(), sequencer.EmbedConfig{
			Dir: t.TempDir(), Name: "a", ClientURL: urls[0], PeerURL: urls[1],
			InitialCluster: "a=" + urls[1] + ",b=" + urls[2] + ",c=" + urls[3],
			StartTimeout:   6 * time.Second, Log: slog.New(slog.NewTextHandler(&logs, nil)),
		})
		done <- err
	}()
	var startErr error
	select {
	case startErr = <-done:
		if startErr == nil || !strings.Contains(startErr.Error(), "not ready after 6s: are the other members") {
			t.Fatalf("start without peers: %v", startErr)
		}
	case <-time.After(time.Minute):
		t.Fatal("StartEmbedded without its peers did not return in a minute")
	}
	if !strings.Contains(logs.String(), "waits for a quorum of its cluster") {
		t.Fatalf("no warning while it waited; logs: %s", logs.String())
	}
	// The member is stopped, not left running: its close ended, and its
	// ports are free. Left running, it exited the process 30 s after its
	// start, once its data dir was gone (defect 88).
	if strings.Contains(startErr.Error(), "did not end") {
		t.Fatalf("the member that gave up was not closed: %v", startErr)
	}
	for _, u := range urls[:2] {
		l, err := net.Listen("tcp", strings.TrimPrefix(u, "http://"))
		if err != nil {
			t.Fatalf("the member that gave up still holds %s: %v", u, err)
		}
		l.Close()
	}
}
