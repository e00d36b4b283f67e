// Package chaos is a randomized fault test of lock takers: workers take,
// refresh, reenter and release locks on a few names through the Lockers of
// a Setup (each a process with links of its own) while a nemesis breaks
// the links at random (cuts, refused connections, partitions longer than a
// TTL, latency, lost replies) and the servers (a paused Redis, a Redis
// restarted empty, a Sentinel failover, a Redis Cluster slot moved, a
// restarted etcd leader, an etcd member its peers cannot hear or one cut
// off from them both ways, a crashed
// and restarted fenced server).
// The history is then checked against guarantees 1 and 2 of
// docs/design.md, and every name must be free and the store empty once
// the faults end. With etcd leases, candidates campaign in an election and
// observers watch it under the same faults (elect.go); an operator in each
// process force-releases holders with IfToken (force.go). The hand-picked
// fault tests put one fault at one moment; this looks for the
// interleavings nobody thought of (docs/design.md, "Under random
// faults").
//
// FENCED_CHAOS=5m runs each setup that long, every setup: five in each
// of lock and client (default 4s and three setups, as CI runs it); go
// test -parallel n runs n of a package's at once (default GOMAXPROCS), and
// past 10m give a -timeout;
// FENCED_CHAOS_SEED=n repeats a run's choices (the scheduler's are its own).
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	workers   = 3 // per Locker
	nameCount = 2
	maxTTL    = 2 * time.Second
	// minGrants is the fewest grants that give the checker something to
	// check; a run with fewer goes on without faults, up to progressGrace,
	// until it has them (Run).
	minGrants     = 3
	progressGrace = 30 * time.Second
)

var ttls = []time.Duration{300 * time.Millisecond, 700 * time.Millisecond, time.Second, maxTTL}

// Setup is what a run works on.
type Setup struct {
	// Lockers take the locks, each as a process of its own would.
	Lockers []lock.Locker
	// Links are the proxies the nemesis breaks, in groups it may break
	// together (a process's links to its servers).
	Links [][]*faultproxy.Proxy
	// Lossy are the proxies whose replies the nemesis may lose, each with
	// bytes that mark a request of the store or API.
	Lossy map[*faultproxy.Proxy][]byte
	// Direct takes every name after the faults, through no proxy.
	Direct lock.Locker
	// Keys lists the store's keys of the locks (not those it keeps for
	// good, such as the token's counter).
	Keys func() []string
	// Etcd are the members of a cluster the nemesis restarts the leader
	// of; nil: none. EtcdPeers are the proxies the members reach each
	// other through (testenv.EtcdClusterProxied), one per member, which
	// it holds one at a time. Redis are servers it pauses, one at a time.
	Etcd      []*sequencer.Embedded
	EtcdPeers []*faultproxy.Proxy
	Redis     []*testenv.RedisProc
	// Restart are Redis servers the nemesis restarts empty (no
	// persistence), one at a time. A grant asked for before a restart may
	// be told "lost" before its deadline after it (its lease was on the
	// server restarted: with Redlock, a bare majority with it).
	// RestartFrees: a restart frees every lock (the one Redis of the
	// leases), so such a grant no longer counts as a holder; false: nobody
	// else is granted the lock before that grant's deadline (Redlock: a
	// restarted node takes no lease until every lease it may have
	// forgotten is over, defect 103).
	Restart      []*testenv.RedisProc
	RestartFrees bool
	// Settle, with Sentinel, returns once Sentinel settled after a fault
	// of a Redis server (a pause, a restart, Failover): it watches a
	// master as up, no failover under way, and that server alone answers
	// as a master. Each such fault may have failed over, which loses what
	// the replica had not seen, so from its start until Settle returned
	// it frees every lock.
	Settle func() error
	// Failover asks Sentinel to fail over (SENTINEL FAILOVER); nil: none.
	Failover func() error
	// Reshard, with a Redis Cluster, moves the slot of name to another
	// master a key at a time, as a reshard does, calling between after
	// each key; nil: none. A MIGRATE keeps a key's TTL and loses nothing,
	// so the locks are checked as strictly as ever.
	Reshard func(name string, r *rand.Rand, between func()) (where string, err error)
	// Elect: the Lockers and Direct hold elections too (lock.Elector,
	// leases in etcd), and candidates and observers of one run with the
	// workers.
	Elect bool
	// Crash, one per Locker, stops that process as a crash would (its
	// store and sequencer stop: nothing is released, nothing renewed any
	// more) and returns the lock client of the process started again over
	// the same links. The API run restarts its servers with it.
	Crash []func() (*lock.Client, error)
	// Servers, one per fenced server (the API run), restart that server as
	// after a crash: down (every request cut off) for as long as down
	// takes, then up with a new process.
	Servers []func(down func()) error
}

// Redis is two processes taking locks with Redis leases, on a Redis of
// the test's own (the nemesis pauses it), with tokens from a three-member
// etcd cluster; each process reaches Redis and every member through
// proxies of its own.
func Redis(t *testing.T) Setup { return redisNodes(t, 1) }

// Redlock is Redis with leases on three Redis nodes of the test's own
// (lock.RedlockStore); the nemesis pauses one at a time, a minority.
func Redlock(t *testing.T) Setup { return redisNodes(t, 3) }

func redisNodes(t *testing.T, n int) Setup {
	s := Setup{Lossy: map[*faultproxy.Proxy][]byte{}}
	s.Etcd, s.EtcdPeers = testenv.EtcdClusterProxied(t, 3)
	prefix := testenv.Name(t) + ":"
	if n > 1 {
		prefix = "fenced:" // a RedlockStore's, on Redis servers of this test's own
	}
	var direct []redis.UniversalClient
	for range n {
		p := testenv.StartRedis(t)
		s.Redis = append(s.Redis, p)
		direct = append(direct, p.Client())
	}
	for range 2 { // processes
		links := s.redisLinks(t)
		var rdbs []redis.UniversalClient
		for _, rp := range links {
			// As fenced serve builds it: a call ends at its context's deadline.
			rdb := redis.NewClient(&redis.Options{Addr: rp.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { rdb.Close() })
			rdbs = append(rdbs, rdb)
		}
		ecli, eps := testenv.ClusterClientProxied(t, s.Etcd)
		s.addProcess(t, func() (*lock.Client, func(), error) { return newRedisProcess(t, rdbs, ecli, prefix) })
		s.Links = append(s.Links, append(links, eps...))
	}
	s.Restart, s.RestartFrees = s.Redis, n == 1
	s.Direct = must(t)(newRedisProcess(t, direct, testenv.ClusterClient(t, s.Etcd), prefix))
	s.Keys = func() []string {
		var all []string
		for _, rdb := range direct {
			keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				// A Redlock node's epoch stays, one per node.
				if k != prefix+"epoch" {
					all = append(all, k)
				}
			}
		}
		return all
	}
	return s
}

// redisLinks are a process's proxies to s.Redis, one each, whose replies
// to scripts the nemesis may lose.
func (s *Setup) redisLinks(t *testing.T) []*faultproxy.Proxy {
	var links []*faultproxy.Proxy
	for _, node := range s.Redis {
		rp, err := faultproxy.New(node.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rp.Close() })
		links = append(links, rp)
		s.Lossy[rp] = []byte("EVALSHA")
	}
	return links
}

// newRedisProcess is a process with leases on rdbs (one: a RedisStore
// with prefix; more: a RedlockStore) and tokens from ecli.
func newRedisProcess(t *testing.T, rdbs []redis.UniversalClient, ecli *clientv3.Client, prefix string) (*lock.Client, func(), error) {
	seq, err := sequencer.NewEtcd(ecli)
	if err != nil {
		return nil, nil, err
	}
	var st interface {
		lock.LeaseStore
		Close() error
	}
	if len(rdbs) == 1 {
		st, err = lock.NewRedisStore(rdbs[0], seq, lock.WithRedisPrefix(prefix))
	} else {
		st, err = lock.NewRedlockStore(rdbs, seq)
	}
	if err != nil {
		seq.Close()
		return nil, nil, err
	}
	return newProcess(t, st, seq)
}

// Sentinel is Redis leases on a master and its replica of the test's own,
// watched by one Sentinel, with tokens from a three-member etcd cluster.
// The nemesis asks Sentinel to fail over, and pauses and restarts the
// servers (Sentinel fails over then too, when the master is down for
// long). Each process reaches the servers through proxies of its own,
// whichever Sentinel names master.
func Sentinel(t *testing.T) Setup {
	s := Setup{Lossy: map[*faultproxy.Proxy][]byte{}}
	s.Etcd, s.EtcdPeers = testenv.EtcdClusterProxied(t, 3)
	// Each server has a config file, which Sentinel rewrites when it
	// makes it a master or a replica, so that a restart keeps that role
	// (started with a --replicaof, the replica would come back following
	// a server that might follow it by then).
	conf := func(lines string) string {
		f := filepath.Join(t.TempDir(), "redis.conf")
		if err := os.WriteFile(f, []byte(lines), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	master := testenv.StartRedisConf(t, conf("save \"\"\nappendonly no\n"))
	replica := testenv.StartRedisConf(t, conf(fmt.Sprintf("save \"\"\nappendonly no\nreplicaof 127.0.0.1 %d\n", master.Port())))
	s.Redis, s.Restart, s.RestartFrees = []*testenv.RedisProc{master, replica}, []*testenv.RedisProc{master, replica}, true
	sentinel := testenv.StartSentinel(t, master)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr})
	t.Cleanup(func() { sc.Close() })
	s.Settle = func() error { return settle(sc, s.Redis) }
	s.Failover = func() error {
		err := sc.Failover(context.Background(), testenv.SentinelMaster).Err()
		if err != nil && (strings.HasPrefix(err.Error(), "INPROG") || strings.HasPrefix(err.Error(), "NOGOODSLAVE")) {
			return nil // Sentinel is busy with one, or sees no replica fit: no failover this time
		}
		return err
	}
	if err := s.Settle(); err != nil {
		t.Fatal(err)
	}

	prefix := testenv.Name(t) + ":"
	// through dials a server Sentinel names through the proxy for it.
	through := func(proxy map[string]string) redis.UniversalClient {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: testenv.SentinelMaster, SentinelAddrs: []string{sentinel.Addr},
			ContextTimeoutEnabled: true, Dialer: dialThrough(proxy)})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	direct := s.proxiedProcesses(t, prefix, through)
	s.Keys = func() []string {
		keys, err := direct.Keys(context.Background(), prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	return s
}

// Cluster is Redis leases on a Redis Cluster of three masters of the
// test's own (no replicas), with tokens from a three-member etcd cluster.
// The nemesis moves the slot of one of the run's names to another master
// a key at a time, as a reshard does (Reshard), and pauses masters. Each
// process reaches every master through a proxy of its own (the cluster
// client's dialer), and so meets MOVED, ASK and TRYAGAIN through them.
func Cluster(t *testing.T) Setup {
	s := Setup{Lossy: map[*faultproxy.Proxy][]byte{}}
	s.Etcd, s.EtcdPeers = testenv.EtcdClusterProxied(t, 3)
	s.Redis = testenv.StartRedisCluster(t, 3)
	admin := testenv.NewClusterAdmin(t, s.Redis)
	addrs := make([]string, len(s.Redis))
	for i, node := range s.Redis {
		addrs[i] = node.Addr
	}
	prefix := testenv.Name(t) + ":"
	// through dials a master through the proxy for it.
	through := func(proxy map[string]string) redis.UniversalClient {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, Dialer: dialThrough(proxy)})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	s.proxiedProcesses(t, prefix, through)
	s.Keys = func() []string {
		var all []string
		for _, node := range s.Redis {
			keys, err := admin.Client(node).Keys(context.Background(), prefix+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, keys...)
		}
		return all
	}
	s.Reshard = func(name string, r *rand.Rand, between func()) (string, error) {
		// Not bounded by the run: a slot left half moved would refuse its
		// locks' calls for good.
		ctx := context.Background()
		slot, err := admin.SlotOf(ctx, prefix+"{"+name+"}:lease")
		if err != nil {
			return "", err
		}
		from, err := admin.Owner(ctx, slot)
		if err != nil {
			return "", err
		}
		to := s.Redis[(admin.Index(from)+1+r.IntN(len(s.Redis)-1))%len(s.Redis)]
		where := fmt.Sprintf("slot %d of %s from %s to %s", slot, name, from.Addr, to.Addr)
		return where, admin.Migrate(ctx, slot, from, to, func() error { between(); return nil })
	}
	return s
}

// proxiedProcesses adds two processes with leases on s.Redis, each
// reaching every server through a proxy of its own: through makes a
// client that dials an address through the proxy the map names for it.
// It returns the client of the direct process, through no proxy.
func (s *Setup) proxiedProcesses(t *testing.T, prefix string, through func(proxy map[string]string) redis.UniversalClient) redis.UniversalClient {
	for range 2 { // processes
		links := s.redisLinks(t)
		proxy := map[string]string{}
		for i, node := range s.Redis {
			proxy[node.Addr] = links[i].Addr()
		}
		rdb := through(proxy)
		ecli, eps := testenv.ClusterClientProxied(t, s.Etcd)
		s.addProcess(t, func() (*lock.Client, func(), error) {
			return newRedisProcess(t, []redis.UniversalClient{rdb}, ecli, prefix)
		})
		s.Links = append(s.Links, append(links, eps...))
	}
	direct := through(nil)
	s.Direct = must(t)(newRedisProcess(t, []redis.UniversalClient{direct}, testenv.ClusterClient(t, s.Etcd), prefix))
	return direct
}

// dialThrough is a go-redis dialer that dials addr through the proxy
// proxy names for it, if any.
func dialThrough(proxy map[string]string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p, ok := proxy[addr]; ok {
			addr = p
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// settle returns once the Sentinel of sc watches a master as up, with no
// failover under way, and of the servers that one alone answers as a
// master: a master that failed over while it was paused or down goes on
// taking writes when it is back, which its conversion to a replica then
// throws away. It returns an error after a minute.
func settle(sc *redis.SentinelClient, nodes []*testenv.RedisProc) error {
	var last string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) { // polling Sentinel, which says nothing when it settles
		last = settled(sc, nodes)
		if last == "" {
			return nil
		}
	}
	return fmt.Errorf("Sentinel did not settle in a minute: %s", last)
}

// settled says what keeps Sentinel from being settled; "": nothing.
func settled(sc *redis.SentinelClient, nodes []*testenv.RedisProc) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	m, err := sc.Master(ctx, testenv.SentinelMaster).Result()
	if err != nil {
		return err.Error()
	}
	if m["flags"] != "master" {
		return fmt.Sprintf("Sentinel says %v", m)
	}
	named := net.JoinHostPort(m["ip"], m["port"])
	if !slices.ContainsFunc(nodes, func(n *testenv.RedisProc) bool { return n.Addr == named }) {
		return fmt.Sprintf("Sentinel names master %s, none of the test's servers", named)
	}
	for _, n := range nodes {
		info, err := n.Client().Info(ctx, "replication").Result()
		if master := err == nil && strings.Contains(info, "role:master"); master != (n.Addr == named) {
			return fmt.Sprintf("Sentinel names master %s; %s answers %v %q", named, n.Addr, err, info)
		}
	}
	return ""
}

// Etcd is two processes taking locks with etcd leases on a three-member
// cluster; each process reaches every member through a proxy of its own.
func Etcd(t *testing.T) Setup {
	s := Setup{Elect: true}
	s.Etcd, s.EtcdPeers = testenv.EtcdClusterProxied(t, 3)
	prefix := "/" + testenv.Name(t) + "/"
	newStore := func(ecli *clientv3.Client) (*lock.Client, func(), error) {
		st, err := lock.NewEtcdStore(ecli, lock.WithEtcdPrefix(prefix))
		if err != nil {
			return nil, nil, err
		}
		return newProcess(t, st)
	}
	for range 2 { // processes
		ecli, eps := testenv.ClusterClientProxied(t, s.Etcd)
		s.addProcess(t, func() (*lock.Client, func(), error) { return newStore(ecli) })
		s.Links = append(s.Links, eps)
	}
	cli := testenv.ClusterClient(t, s.Etcd)
	s.Direct = must(t)(newStore(cli))
	s.Keys = func() []string {
		keys, err := etcdKeys(context.Background(), cli, prefix)
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	return s
}

// AbandonedFor is how long an abandoned attempt's mark lasts in etcd:
// lock/etcd.go's abandonedFor (lock.TestChaosAbandonedFor checks that
// they agree).
const AbandonedFor = time.Minute

// abandonedMargin is how much longer than AbandonedFor a mark's lease may
// have left: etcd extends every lease by an election timeout (500 ms
// here) when a new leader takes over.
const abandonedMargin = 5 * time.Second

// etcdKeys lists the keys of the locks under prefix. The token's counter
// and floor stay, one each per store; an abandoned attempt's mark names no
// lock and goes with its lease (one of 2 s of marks) within AbandonedFor
// and 2 s (lock/etcd.go, abandon), so a mark is listed, saying why, only when it is on no lease
// or on one with longer left: such a mark stays (docs/design.md, defect
// 206).
func etcdKeys(ctx context.Context, cli *clientv3.Client, prefix string) ([]string, error) {
	r, err := cli.Get(ctx, prefix, clientv3.WithPrefix()) // not WithKeysOnly: that leaves out the lease
	if err != nil {
		return nil, err
	}
	var keys []string
	left := map[clientv3.LeaseID]int64{} // seconds, by lease
	for _, kv := range r.Kvs {
		k := string(kv.Key)
		switch {
		case k == prefix+"counter" || k == prefix+"floor":
		case !strings.HasPrefix(k, prefix+"abandoned/"):
			keys = append(keys, k)
		case kv.Lease == 0:
			keys = append(keys, k+" (an abandoned mark on no lease)")
		default:
			id := clientv3.LeaseID(kv.Lease)
			ttl, ok := left[id]
			if !ok {
				l, err := cli.TimeToLive(ctx, id)
				if err != nil {
					return nil, err
				}
				ttl, left[id] = l.TTL, l.TTL // -1: the lease is over, and the mark gone with it
			}
			if time.Duration(ttl)*time.Second > AbandonedFor+abandonedMargin {
				keys = append(keys, fmt.Sprintf("%s (an abandoned mark on a lease with %d s left, longer than the mark's %s)", k, ttl, AbandonedFor))
			}
		}
	}
	return keys, nil
}

// newProcess is the lock client of a process over store st, whose
// closers (the store first) stop it as a crash would; t.Cleanup closes
// them and the client. It may run on the nemesis's goroutine.
func newProcess(t *testing.T, st lock.LeaseStore, closers ...io.Closer) (*lock.Client, func(), error) {
	closers = append([]io.Closer{st.(io.Closer)}, closers...)
	stop := sync.OnceFunc(func() {
		for _, c := range closers {
			c.Close()
		}
	})
	c, err := lock.New(st)
	if err != nil {
		stop()
		return nil, nil, err
	}
	t.Cleanup(stop)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c, stop, nil
}

// addProcess starts a process with start and makes its Crash, which stops
// it and starts it again with start over the same links.
func (s *Setup) addProcess(t *testing.T, start func() (*lock.Client, func(), error)) {
	c, stop, err := start()
	if err != nil {
		t.Fatal(err)
	}
	s.Lockers = append(s.Lockers, c)
	s.Crash = append(s.Crash, func() (*lock.Client, error) {
		stop()
		c, again, err := start()
		if err != nil {
			return nil, err
		}
		stop = again
		return c, nil
	})
}

// must is the lock client of a process started on the test's goroutine.
func must(t *testing.T) func(*lock.Client, func(), error) *lock.Client {
	return func(c *lock.Client, _ func(), err error) *lock.Client {
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// Long reports whether FENCED_CHAOS asks for a run of its own: then every
// setup runs; without it, CI's short run takes those that find the most
// (Redis and etcd leases in the SDK, etcd leases through the API) and
// leaves the others, which cost CI time for little more.
func Long() bool { return os.Getenv("FENCED_CHAOS") != "" }

// SkipUnlessLong skips a setup of the long run only.
func SkipUnlessLong(t *testing.T) {
	if !Long() {
		t.Skip("runs with FENCED_CHAOS set (e.g. FENCED_CHAOS=2m); CI's short run takes the other setups")
	}
}

// Duration is FENCED_CHAOS, default 4s.
func Duration(t *testing.T) time.Duration {
	d := 4 * time.Second
	if v := os.Getenv("FENCED_CHAOS"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("FENCED_CHAOS=%q: want a duration such as 5m", v)
		}
	}
	return d
}

// Seed is FENCED_CHAOS_SEED, default the clock; logged to repeat a run.
func Seed(t *testing.T) int64 {
	seed := time.Now().UnixNano()
	if v := os.Getenv("FENCED_CHAOS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("FENCED_CHAOS_SEED=%q: want an integer", v)
		}
	}
	t.Logf("seed %d (FENCED_CHAOS_SEED=%d repeats the choices)", seed, seed)
	return seed
}

// grant is one grant (one lease id) as its holder saw it.
type grant struct {
	name    string
	who     string // process and worker
	id      string
	token   fence.Token
	invoked time.Time // the Acquire call that granted it began
	granted time.Time // and returned
	// first and believed are the first and the last instant the holder
	// checked that it held the lock (its deadline ahead, not lost) and
	// found it did: the span in which it would have written. Zero: never.
	first, believed time.Time
}

// history collects grants by lease id.
type history struct {
	mu     sync.Mutex
	grants map[string]*grant
	ops    map[string]int // outcomes by kind, for the log and the sanity check
	wrong  []string       // what the workers saw that must not happen
	forces []forced       // the operators' force-releases
	// restarts are when restarts of a Redis of the leases (and, with
	// Sentinel, every fault of its servers) may have taken leases with
	// them; restartsFree: each freed every lock (Setup.RestartFrees).
	restarts     []window
	restartsFree bool
	early        []lostEarly // "lost" answers before the holder's deadline
	// enough is closed at the minGrants-th grant.
	enough chan struct{}
}

// window is when a fault of a Redis server of the leases may have taken
// leases with it: a restart from its start until the server is back (a
// grant asked for meanwhile may have been written before the kill); a fault Sentinel may
// answer with a failover, from its start until Sentinel settled.
type window struct{ from, to time.Time }

// lostEarly is a "lost" answered before the deadline its holder believed:
// wrong unless a force-release of that grant was sent before it.
type lostEarly struct {
	name  string
	token fence.Token
	at    time.Time
	what  string
}

// answered counts the outcome of op on l, begun while l's deadline was
// dl. A "lost" answered before that deadline says the store let the
// lease go while its holder was told it held it: the store keeps a lease
// at least until the deadline it granted, and a request sent again after
// a lost answer must not find its own earlier success "lost".
func (h *history) answered(op string, l *lock.Lease, dl time.Time, err error) {
	now := time.Now()
	h.count(outcome(op, err))
	if errors.Is(err, lock.ErrLost) && now.Before(dl) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.early = append(h.early, lostEarly{name: l.Name(), token: l.Token(), at: now, what: fmt.Sprintf("%s of %s (token %d, lease %s, granted or refreshed at %s for %s) answered %q at %s, before its deadline %s",
			op, l.Name(), l.Token(), l.ID(), l.Started().Format(timeFormat), l.TTL(), err, now.Format(timeFormat), dl.Format(timeFormat))})
	}
}

func (h *history) count(what string) {
	h.mu.Lock()
	h.ops[what]++
	h.mu.Unlock()
}

// granted records a grant, or a reentry of one (same id).
func (h *history) granted(t *testing.T, who, name string, l *lock.Lease, invoked, granted time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g, ok := h.grants[l.ID()]; ok {
		if g.token != l.Token() || g.name != name {
			t.Errorf("lease %s granted again as %s token %d, first %s token %d", l.ID(), name, l.Token(), g.name, g.token)
		}
		return
	}
	h.grants[l.ID()] = &grant{name: name, who: who, id: l.ID(), token: l.Token(), invoked: invoked, granted: granted}
	if len(h.grants) == minGrants {
		close(h.enough)
	}
}

// holds is the holder's check before it would write: the lease is not
// lost and its deadline is ahead.
func (h *history) holds(l *lock.Lease) {
	dl := l.Deadline()
	now := time.Now()
	if !now.Before(dl) || l.Err() != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.grants[l.ID()]
	if g.first.IsZero() {
		g.first = now
	}
	g.believed = now
}

// Run runs the workload under the nemesis for FENCED_CHAOS (default 4s),
// then checks the history and that every name is free and the store
// empty once the faults end.
func Run(t *testing.T, s Setup) {
	d, seed := Duration(t), Seed(t)
	h := &history{grants: map[string]*grant{}, ops: map[string]int{}, enough: make(chan struct{})}
	names := make([]string, nameCount)
	for i := range names {
		names[i] = testenv.Name(t)
	}
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	// The faults end with ctx; the workers go on after them, without
	// faults, until the run has minGrants grants (at most progressGrace
	// after the nemesis healed everything): on a machine starved of CPU
	// the faults' few seconds may end before anything was granted, and a
	// history of nothing checks nothing. A workload that makes no progress
	// even then fails below. A step under way when the work stops runs to
	// its end (each is bounded), so no call is cut short by the test.
	healed, stopWork, quit := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(quit)
	go func() {
		defer close(stopWork)
		select {
		case <-healed:
		case <-quit:
			return
		}
		select {
		case <-h.enough:
		case <-time.After(progressGrace):
		case <-quit:
		}
	}()
	working := func() bool {
		select {
		case <-stopWork:
			return false
		default:
			return true
		}
	}

	// Each worker, candidate, operator and the nemesis say when they are
	// done.
	perProcess := workers + 1
	if s.Elect {
		perProcess += candidates
	}
	done := make(chan struct{}, len(s.Lockers)*perProcess+1)
	var election string
	var observers []*observer
	if s.Elect {
		election = testenv.Name(t)
		// Observers watch past the faults, until checkElection is done.
		octx, stop := context.WithCancel(context.Background())
		var watching sync.WaitGroup
		t.Cleanup(func() { stop(); watching.Wait() })
		for p, c := range s.Lockers {
			o := newObserver(fmt.Sprintf("p%do", p))
			observers = append(observers, o)
			watching.Go(func() { observe(octx, h, c.(lock.Elector), election, o) })
		}
	}
	for p, c := range s.Lockers {
		for w := range perProcess {
			r := rand.New(rand.NewPCG(uint64(seed), uint64(p*perProcess+w+1)))
			work := func() {
				who := fmt.Sprintf("p%dw%d", p, w)
				for working() {
					step(t, t.Context(), h, c, who, names[r.IntN(len(names))], r)
				}
			}
			switch {
			case w == workers:
				work = func() {
					forceable := names
					if s.Elect {
						forceable = append(slices.Clone(names), election)
					}
					operate(ctx, h, c.(forcer), forceable, r)
				}
			case w > workers:
				work = func() {
					who := fmt.Sprintf("p%dc%d", p, w-workers-1)
					for ctx.Err() == nil {
						campaign(t, ctx, h, c.(lock.Elector), who, election, r)
					}
				}
			}
			go func() {
				work()
				done <- struct{}{}
			}()
		}
	}
	faults := map[string]int{}
	var healedAt time.Time // and the grants then; read after every done
	var grantsHealed int
	go func() {
		nemesis(ctx, t, s, h, rand.New(rand.NewPCG(uint64(seed), 0)), names, faults)
		h.mu.Lock()
		healedAt, grantsHealed = time.Now(), len(h.grants)
		h.mu.Unlock()
		close(healed)
		done <- struct{}{}
	}()
	// Every worker ends its step after the faults end (or after the
	// progressGrace that may follow them): an acquisition's wait, a hold
	// and its release are bounded (step, campaign), so one that does not
	// return in a minute is stuck.
	stuck := time.After(d + progressGrace + time.Minute)
	for left := cap(done); left > 0; left-- {
		select {
		case <-done:
		case <-stuck:
			t.Fatalf("%d of the workers and nemesis still running a minute after the faults ended: a call did not return", left)
		}
	}
	t.Logf("%s of faults: %v; outcomes: %v; %d grants", d, faults, h.ops, len(h.grants))
	if grantsHealed < minGrants {
		t.Logf("%d grants when the faults were healed: the workers went on %s after, to have %d to check", grantsHealed, time.Since(healedAt).Round(time.Millisecond), minGrants)
	}
	for what := range h.ops {
		if strings.Contains(what, " other: ") {
			t.Errorf("an outcome no fault explains: %s", what)
		}
	}
	if len(h.grants) < minGrants {
		t.Fatalf("only %d grants in %s of faults and %s after they were healed: the workload made no progress to check", len(h.grants), d, progressGrace)
	}
	for _, w := range append(h.wrong, checkHistory(h)...) {
		t.Error(w)
	}

	// Once the faults are over, every name is free within the longest TTL
	// and a queue place's life (a release or leave whose reply was lost),
	// and nothing of the locks is left in the store after that.
	for _, name := range names {
		l, err := s.Direct.Acquire(t.Context(), name, time.Second, lock.WithWait(maxTTL+lock.DefaultWaiterTTL+3*time.Second))
		if err != nil {
			t.Fatalf("%s after the faults: %v", name, err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if s.Elect {
		checkElection(t, s, h, election, observers)
	}
	keys := s.Keys()
	t.Logf("keys of the locks in the store once every name was free: %q", keys)
	deadline := time.Now().Add(maxTTL + lock.DefaultWaiterTTL + 10*time.Second)
	for ; len(keys) > 0; keys = s.Keys() {
		if time.Now().After(deadline) {
			t.Fatalf("keys of the locks still in the store after every lease and queue place expired: %q", keys)
		}
		time.Sleep(20 * time.Millisecond) // polling the store, which says nothing when a key expires
	}
}

// step is one worker's acquisition, hold and release of name, each
// choice random: a try or a wait, fair or not, reentrant or not, refreshed
// or kept alive or neither.
func step(t *testing.T, ctx context.Context, h *history, c lock.Locker, who, name string, r *rand.Rand) {
	ttl := ttls[r.IntN(len(ttls))]
	var opts []lock.Option
	if r.IntN(3) == 0 {
		opts = append(opts, lock.WithUnfair())
	}
	reentrant := r.IntN(4) == 0
	if reentrant {
		opts = append(opts, lock.WithHolder(who))
	}
	// A long hold works past its TTL, looking before each write whether it
	// still holds the lock: with a keep-alive that a fault can stop, or
	// without, where only the deadline ends it.
	long := r.IntN(3) == 0
	if r.IntN(4) == 0 || long && r.IntN(3) != 0 {
		opts = append(opts, lock.WithKeepAlive())
	}
	wait := time.Duration(r.IntN(1000)) * time.Millisecond
	if r.IntN(4) != 0 {
		opts = append(opts, lock.WithWait(wait))
	}
	// The call's context bounds it where a partition would hold it.
	actx, cancel := context.WithTimeout(ctx, wait+2*time.Second)
	defer cancel()
	invoked := time.Now()
	l, err := c.Acquire(actx, name, ttl, opts...)
	if err != nil {
		h.count(outcome("acquire", err))
		return
	}
	h.granted(t, who, name, l, invoked, time.Now())
	h.count("granted")
	held := []*lock.Lease{l}
	if long {
		for end := time.Now().Add(ttl/2 + time.Duration(r.Int64N(int64(3*ttl/2)))); time.Now().Before(end); {
			h.holds(l)
			time.Sleep(ttl / 10)
		}
	}
	for range 1 + r.IntN(3) {
		h.holds(l)
		time.Sleep(time.Duration(r.Int64N(int64(ttl / 3)))) // the work under the lock
		h.holds(l)
		switch r.IntN(3) {
		case 0:
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			dl, start, ask := believed(l, len(held)), time.Now(), ttls[r.IntN(len(ttls))]
			err := l.Refresh(rctx, ask)
			cancel()
			// A refresh to a shorter TTL ends the lease sooner, and then
			// lost is its answer if it came after that, or if an attempt
			// of it applied and lost its answer, and one sent again came
			// after that.
			if end := start.Add(ask - lock.Drift(ask)); end.Before(dl) {
				dl = end
			}
			h.answered("refresh", l, dl, err)
		case 1:
			if reentrant {
				invoked := time.Now()
				actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				again, err := c.TryAcquire(actx, name, ttl, lock.WithHolder(who))
				cancel()
				h.count(outcome("reenter", err))
				if err == nil {
					h.granted(t, who, name, again, invoked, time.Now())
					held = append(held, again)
				}
			}
		}
	}
	h.holds(l)
	for i := len(held) - 1; i >= 0; i-- {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		dl := believed(held[i], len(held))
		err := held[i].Release(rctx)
		cancel()
		h.answered("release", held[i], dl, err)
	}
}

// believed is l's deadline if its holder believes it holds l now, else
// zero. With a reentry, one lease id has two Leases whose deadlines a
// refresh of one does not move in the other (a shorter one leaves the
// other's too late): no deadline is believed then.
func believed(l *lock.Lease, leases int) time.Time {
	dl := l.Deadline()
	if leases > 1 || l.Err() != nil || !time.Now().Before(dl) {
		return time.Time{}
	}
	return dl
}

// outcome names an outcome for the log: op and the error's kind,
// "other: ..." for an error none of the kinds a fault explains. Through
// the API a fault may also be a 503 (the server's store failed), no
// answer in time, or a connection that failed.
func outcome(op string, err error) string {
	var (
		held *lock.HeldError
		be   *lock.BackendError
		ae   *client.APIError
		ue   *url.Error
	)
	switch {
	case err == nil:
		return op + " ok"
	case errors.As(err, &held), errors.Is(err, lock.ErrNotAcquired), errors.Is(err, lock.ErrHeldByOther):
		return op + " held"
	case errors.Is(err, lock.ErrLost):
		return op + " lost"
	case errors.As(err, &be):
		return op + " backend"
	case errors.Is(err, context.DeadlineExceeded):
		return op + " deadline"
	case errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable:
		return op + " unavailable"
	case errors.Is(err, client.ErrNoAnswer):
		return op + " no answer"
	case errors.As(err, &ue):
		return op + " connection"
	default:
		return op + " other: " + err.Error()
	}
}

// nemesis breaks a random group of links, or the servers, one fault at a
// time, until ctx ends, and heals everything at the end.
func nemesis(ctx context.Context, t *testing.T, s Setup, h *history, r *rand.Rand, names []string, faults map[string]int) {
	defer func() {
		for _, links := range append(s.Links, s.EtcdPeers) {
			for _, p := range links {
				p.Hold(false)
				p.Refuse(false)
				p.SetLatency(0)
			}
		}
	}()
	pause := func(max time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Duration(r.Int64N(int64(max)))):
			return true
		}
	}
	kinds := []string{"cut", "refuse", "partition", "latency", "none"}
	if len(s.Lossy) > 0 {
		kinds = append(kinds, "lost reply")
	}
	if len(s.Redis) > 0 {
		kinds = append(kinds, "redis paused")
	}
	if len(s.Restart) > 0 {
		kinds = append(kinds, "redis restarted")
	}
	if s.Failover != nil {
		kinds = append(kinds, "redis failed over")
	}
	if s.Reshard != nil {
		kinds = append(kinds, "redis slot moved")
	}
	if s.Etcd != nil {
		kinds = append(kinds, "etcd leader restarted")
	}
	// Long runs only: a member cut off so still takes its clients'
	// requests and answers none (it hears the leader, which does not hear
	// it), so two holds in a row can leave CI's 4 s without a grant.
	if len(s.EtcdPeers) > 0 && Long() {
		kinds = append(kinds, "etcd member's peer port held")
		// Also long runs only: what the member takes before it notices
		// it is alone it holds for etcd's request timeout (defect 108).
		kinds = append(kinds, "etcd member cut off")
	}
	if len(s.Servers) > 0 {
		kinds = append(kinds, "fenced restarted")
	}
	// How long a paused Redis may stay paused: past the longest TTL in
	// long runs; in CI's 4 s at most 1.5 s (past the shorter TTLs), for a
	// single Redis stops every worker, and two long pauses in a row left
	// the run one grant to check (seed 1796667568804971643, 2 of 2).
	stall := 3 * time.Second
	if !Long() {
		stall = 1500 * time.Millisecond
	}
	for pause(400 * time.Millisecond) {
		// One link of a group, or all of them (a process cut off).
		group := r.IntN(len(s.Links))
		links, where := s.Links[group], fmt.Sprintf("process %d's links", group)
		if i := r.IntN(len(links) + 1); i < len(links) {
			links, where = links[i:i+1], fmt.Sprintf("process %d's link %d", group, i)
		}
		each := func(f func(*faultproxy.Proxy)) {
			for _, p := range links {
				f(p)
			}
		}
		kind, began := kinds[r.IntN(len(kinds))], time.Now()
		switch kind {
		case "cut":
			each((*faultproxy.Proxy).CutAll)
		case "refuse":
			each(func(p *faultproxy.Proxy) { p.CutAll(); p.Refuse(true) })
			pause(time.Second)
			each(func(p *faultproxy.Proxy) { p.Refuse(false) })
		case "partition":
			// Longer than the shorter TTLs: holders must stop believing
			// before another is granted.
			each(func(p *faultproxy.Proxy) { p.Hold(true) })
			pause(3 * time.Second)
			each(func(p *faultproxy.Proxy) { p.Hold(false) })
		case "latency":
			d := time.Duration(1+r.IntN(50)) * time.Millisecond
			each(func(p *faultproxy.Proxy) { p.SetLatency(d) })
			pause(time.Second)
			each(func(p *faultproxy.Proxy) { p.SetLatency(0) })
		case "lost reply":
			p := links[r.IntN(len(links))]
			pattern, ok := s.Lossy[p]
			if !ok {
				kind = "none"
				break
			}
			p.LoseReply(pattern)
		case "redis paused":
			node := s.Redis[r.IntN(len(s.Redis))]
			where = node.Addr
			node.Stop()
			pause(stall)
			node.Cont()
		case "redis restarted":
			node := s.Restart[r.IntN(len(s.Restart))]
			where = node.Addr
			err := node.Restart()
			if s.Settle == nil {
				// To the end of the restart: a grant asked for after began
				// but written before the kill went with it too.
				h.mu.Lock()
				h.restarts, h.restartsFree = append(h.restarts, window{began, time.Now()}), s.RestartFrees
				h.mu.Unlock()
			}
			if err != nil {
				t.Error(err)
				return
			}
		case "redis slot moved":
			var err error
			where, err = s.Reshard(names[r.IntN(len(names))], r, func() { pause(50 * time.Millisecond) })
			if err != nil {
				t.Error(err)
				return
			}
		case "redis failed over":
			where = "Sentinel"
			if err := s.Failover(); err != nil {
				t.Error(err)
				return
			}
		case "fenced restarted":
			i := r.IntN(len(s.Servers))
			where = fmt.Sprintf("fenced server %d", i)
			if err := s.Servers[i](func() { pause(time.Second) }); err != nil {
				t.Error(err)
				return
			}
		case "etcd member's peer port held":
			// The leader more often than not: a leader that cannot be
			// heard goes on serving until it hears of a later term.
			i := slices.IndexFunc(s.Etcd, (*sequencer.Embedded).IsLeader)
			if i < 0 || r.IntN(3) == 0 {
				i = r.IntN(len(s.EtcdPeers))
			}
			where = fmt.Sprintf("etcd member %d", i)
			s.EtcdPeers[i].Hold(true)
			pause(3 * time.Second)
			s.EtcdPeers[i].Hold(false)
		case "etcd member cut off":
			// From the others, both ways, while its clients reach it: a
			// follower, or the leader, which then steps down.
			i := r.IntN(len(s.EtcdPeers))
			where = fmt.Sprintf("etcd member %d", i)
			heal := testenv.Isolate(s.Etcd, s.EtcdPeers, i)
			pause(4 * time.Second)
			heal()
		case "etcd leader restarted":
			i := slices.IndexFunc(s.Etcd, (*sequencer.Embedded).IsLeader)
			if i < 0 {
				kind = "none"
				break
			}
			where = fmt.Sprintf("etcd member %d", i)
			s.Etcd[i].Close()
			pause(2 * time.Second)
			if _, err := testenv.RestartMember(t, s.Etcd, i); err != nil {
				t.Error(err)
				return
			}
		}
		if s.Settle != nil && strings.HasPrefix(kind, "redis ") {
			err := s.Settle()
			h.mu.Lock()
			h.restarts, h.restartsFree = append(h.restarts, window{began, time.Now()}), true
			h.mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
		}
		faults[kind]++
		// The timeline, to read a finding against (go test -v, or a failure).
		t.Logf("fault %s, %s, from %s to %s", kind, where, began.Format(timeFormat), time.Now().Format(timeFormat))
	}
}

// checkHistory checks guarantees 1 and 2 of docs/design.md over the
// grants: per name, distinct grants have distinct tokens; a grant that
// began after another was granted has a higher token; and no two holders
// believed they held the same lock at the same time (guarantee 2 holds
// under the faults here: they cut, slow or pause the links and servers,
// but no holder is paused, no Redis fails over and no clock jumps), nor
// was told "lost" before its deadline, each but for a grant deposed: one
// an operator force-released, or one asked for before a restart of a Redis
// that kept its lease (which may lose it; and where the restart freed
// every lock, no longer holds it). It returns what it found wrong.
func checkHistory(h *history) (wrong []string) {
	forced := firstForced(h.forces)
	byName := map[string][]*grant{}
	deposed, mayLose := map[grantKey]time.Time{}, map[grantKey]time.Time{}
	for k, at := range forced {
		deposed[k], mayLose[k] = at, at
	}
	freed := h.restarts
	if !h.restartsFree {
		freed = nil
	}
	for _, g := range h.grants {
		byName[g.name] = append(byName[g.name], g)
		k := grantKey{g.name, g.token}
		deposed[k], mayLose[k] = deposedAt(g, forced[k], freed), deposedAt(g, forced[k], h.restarts)
	}
	for name, gs := range byName {
		sort.Slice(gs, func(i, j int) bool { return gs[i].granted.Before(gs[j].granted) })
		tokens := map[fence.Token]*grant{}
		for _, g := range gs {
			if o, ok := tokens[g.token]; ok {
				wrong = append(wrong, fmt.Sprintf("%s: token %d granted twice: to %s (lease %s) and %s (lease %s)", name, g.token, o.who, o.id, g.who, g.id))
			}
			tokens[g.token] = g
		}
		spans := make([]span, len(gs))
		for i, g := range gs {
			spans[i] = spanOf(g, deposed[grantKey{g.name, g.token}])
		}
		for i, a := range gs {
			for j, b := range gs {
				if a == b {
					continue
				}
				if a.granted.Before(b.invoked) && a.token >= b.token {
					wrong = append(wrong, fmt.Sprintf("%s: %s was granted token %d at %s, and %s, asking after that (%s), got %d",
						name, a.who, a.token, a.granted.Format(timeFormat), b.who, b.invoked.Format(timeFormat), b.token))
				}
				sa, sb := spans[i], spans[j]
				if sa.ok && sb.ok && a.token < b.token && !sa.until.Before(sb.from) && !sb.until.Before(sa.from) {
					wrong = append(wrong, fmt.Sprintf("%s: two holders at once: %s (token %d) believed it held it until %s, %s (token %d) from %s",
						name, a.who, a.token, sa.until.Format(timeFormat), b.who, b.token, sb.from.Format(timeFormat)))
				}
			}
		}
	}
	for _, e := range h.early {
		if d := mayLose[grantKey{e.name, e.token}]; d.IsZero() || !d.Before(e.at) {
			wrong = append(wrong, e.what)
		}
	}
	return wrong
}

// deposedAt is when g was deposed: at forced, the first force-release of
// it sent (zero: none), or at the first restart (or failover) that may
// have taken its lease: one not over before it was asked for, from its
// start or the ask, whichever came later; zero: never.
func deposedAt(g *grant, forced time.Time, restarts []window) time.Time {
	at := forced
	for _, w := range restarts {
		if w.to.Before(g.invoked) {
			continue
		}
		r := w.from
		if r.Before(g.invoked) {
			r = g.invoked
		}
		if at.IsZero() || r.Before(at) {
			at = r
		}
	}
	return at
}

// span is when a grant's holder believed it held the lock, as far as it
// counts; ok false: never.
type span struct {
	from, until time.Time
	ok          bool
}

// spanOf is g's span: deposed (zero: never) ends it, whatever its holder
// believed after that.
func spanOf(g *grant, deposed time.Time) span {
	until := g.believed
	if !deposed.IsZero() && deposed.Before(until) {
		until = deposed
	}
	return span{g.first, until, !g.first.IsZero() && !until.Before(g.first)}
}

const timeFormat = "15:04:05.000000"
