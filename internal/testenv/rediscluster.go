package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedisCluster starts n masters in cluster mode and joins them into one
// cluster with the slots spread over them.
func StartRedisCluster(t testing.TB, n int) []*RedisProc {
	t.Helper()
	return StartRedisClusterReplicated(t, n, 0)
}

// StartRedisClusterReplicated starts a cluster of n masters with the slots
// spread over them and replicas replicas each, in sync with their masters
// when it returns; ROLE tells which node is which. A master that stops
// answering fails over after two seconds (cluster-node-timeout).
func StartRedisClusterReplicated(t testing.TB, n, replicas int) []*RedisProc {
	t.Helper()
	nodes := make([]*RedisProc, n*(1+replicas))
	addrs := make([]string, len(nodes))
	for i := range nodes {
		nodes[i] = StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		addrs[i] = nodes[i].Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, nd := range nodes {
		c := nd.Client()
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			ok := err == nil && strings.Contains(info, "cluster_state:ok")
			if ok {
				// A replica must have its master's data, or a failover
				// loses what the test wrote.
				repl, err := c.Info(context.Background(), "replication").Result()
				ok = err == nil && (strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"))
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s: %v %s", nd.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond) // polling cluster formation
		}
	}
	return nodes
}

// ClusterAdmin moves the slots of a test cluster between its masters, as
// redis-cli --cluster reshard does, and says which node serves what. Its
// methods return errors rather than fail the test: the randomized fault
// test's nemesis calls them from a goroutine of its own.
type ClusterAdmin struct {
	nodes []*RedisProc
	rdbs  []*redis.Client // a client of each node
	ids   []string        // each node's cluster id
}

// NewClusterAdmin administers the cluster of nodes (StartRedisCluster).
func NewClusterAdmin(t testing.TB, nodes []*RedisProc) *ClusterAdmin {
	t.Helper()
	a := &ClusterAdmin{nodes: nodes}
	for _, n := range nodes {
		rdb := n.Client()
		id, err := rdb.ClusterMyID(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		a.rdbs, a.ids = append(a.rdbs, rdb), append(a.ids, id)
	}
	return a
}

// Index is where n is among the nodes; -1 if nowhere.
func (a *ClusterAdmin) Index(n *RedisProc) int { return slices.Index(a.nodes, n) }

// Client is a client of node n alone: it follows no redirect.
func (a *ClusterAdmin) Client(n *RedisProc) *redis.Client { return a.rdbs[a.Index(n)] }

// SlotOf is the slot of key.
func (a *ClusterAdmin) SlotOf(ctx context.Context, key string) (int, error) {
	s, err := a.rdbs[0].ClusterKeySlot(ctx, key).Result()
	return int(s), err
}

// Owner is the master that serves slot, as the first node sees it.
func (a *ClusterAdmin) Owner(ctx context.Context, slot int) (*RedisProc, error) {
	shards, err := a.rdbs[0].ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start > int64(slot) || int64(slot) > r.End {
				continue
			}
			for _, n := range sh.Nodes {
				if i := slices.Index(a.ids, n.ID); n.Role == "master" && i >= 0 {
					return a.nodes[i], nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no master of the test's serves slot %d", slot)
}

// ReplicaOf is the replica of master, as its ROLE says.
func (a *ClusterAdmin) ReplicaOf(ctx context.Context, master *RedisProc) (*RedisProc, error) {
	for i, n := range a.nodes {
		role, err := a.rdbs[i].Do(ctx, "ROLE").Slice()
		if err != nil {
			return nil, err
		}
		if role[0] == "slave" && fmt.Sprint(role[2]) == strconv.Itoa(master.Port()) {
			return n, nil
		}
	}
	return nil, fmt.Errorf("%s has no replica", master.Addr)
}

// Migrate moves slot from one master to another: once the cluster is ok
// (as redis-cli --cluster reshard checks first), Begin, then its keys one
// MIGRATE at a time, calling between after each, then Finish.
func (a *ClusterAdmin) Migrate(ctx context.Context, slot int, from, to *RedisProc, between func() error) error {
	if err := a.WaitOK(ctx, 30*time.Second); err != nil {
		return err
	}
	if err := a.Begin(ctx, slot, from, to); err != nil {
		return err
	}
	for moved := 0; ; moved++ {
		keys, err := a.Client(from).ClusterGetKeysInSlot(ctx, slot, 1).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		if moved == 10_000 {
			return fmt.Errorf("slot %d: still keys to move from %s after %d", slot, from.Addr, moved)
		}
		if err := a.Move(ctx, from, to, keys[0]); err != nil {
			return err
		}
		if err := between(); err != nil {
			return err
		}
	}
	return a.Finish(ctx, slot, to)
}

// Begin marks slot IMPORTING on to and MIGRATING on from.
func (a *ClusterAdmin) Begin(ctx context.Context, slot int, from, to *RedisProc) error {
	if err := a.do(ctx, to, "CLUSTER", "SETSLOT", slot, "IMPORTING", a.ids[a.Index(from)]); err != nil {
		return err
	}
	return a.do(ctx, from, "CLUSTER", "SETSLOT", slot, "MIGRATING", a.ids[a.Index(to)])
}

// Move migrates keys from one master to another, a MIGRATE each, keeping
// their TTLs; NOKEY (a key expired meanwhile) is no error. A MIGRATE
// refused while the cluster is down (a master paused past its node
// timeout) moved nothing: it is sent again once the cluster is ok, as an
// operator would, rather than leave the slot half moved.
func (a *ClusterAdmin) Move(ctx context.Context, from, to *RedisProc, keys ...string) error {
	for _, k := range keys {
		for {
			err := a.Client(from).Migrate(ctx, "127.0.0.1", strconv.Itoa(to.Port()), k, 0, 5*time.Second).Err()
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "CLUSTERDOWN") {
				return fmt.Errorf("MIGRATE %s from %s to %s: %w", k, from.Addr, to.Addr, err)
			}
			if err := a.WaitOK(ctx, 30*time.Second); err != nil {
				return fmt.Errorf("MIGRATE %s from %s to %s: %w", k, from.Addr, to.Addr, err)
			}
		}
	}
	return nil
}

// WaitOK returns once every node says the cluster is ok; an error if not
// within the given time.
func (a *ClusterAdmin) WaitOK(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		bad := ""
		for i, rdb := range a.rdbs {
			if info, err := rdb.ClusterInfo(ctx).Result(); err != nil || !strings.Contains(info, "cluster_state:ok") {
				bad = fmt.Sprintf("%s: %v %q", a.nodes[i].Addr, err, info)
				break
			}
		}
		if bad == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the cluster is not ok after %s: %s", within, bad)
		}
		time.Sleep(20 * time.Millisecond) // polling: the cluster says nothing when it recovers
	}
}

// Finish assigns slot to its new master on every node, that master first.
func (a *ClusterAdmin) Finish(ctx context.Context, slot int, to *RedisProc) error {
	toID := a.ids[a.Index(to)]
	if err := a.do(ctx, to, "CLUSTER", "SETSLOT", slot, "NODE", toID); err != nil {
		return err
	}
	for _, n := range a.nodes {
		if n != to {
			if err := a.do(ctx, n, "CLUSTER", "SETSLOT", slot, "NODE", toID); err != nil {
				return err
			}
		}
	}
	return nil
}

func (a *ClusterAdmin) do(ctx context.Context, n *RedisProc, args ...any) error {
	if err := a.Client(n).Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("%s on %s: %w", fmt.Sprint(args...), n.Addr, err)
	}
	return nil
}
