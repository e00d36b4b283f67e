package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/fenced/fenced/internal/redact"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// redisFlags configure the Redis client of the Redis lease store: serve's
// --lease-store=redis, and dev's --redis-addr.
type redisFlags struct {
	addr, sentinelAddrs, master, clusterAddrs string
	username, password, sentinelPassword      string
	db                                        int
	tls                                       bool
	tlsFiles                                  tlsFiles
	prefix                                    string
}

func (r *redisFlags) register(fs *flag.FlagSet) {
	r.registerAddr(fs, "A single Redis server, `host:port`.")
	fs.StringVar(&r.sentinelAddrs, "redis-sentinel-addrs", "", "Redis Sentinel: the sentinels, `host:port,...` (needs --redis-master).")
	fs.StringVar(&r.master, "redis-master", "", "Redis Sentinel: the master `name` the sentinels watch.")
	fs.StringVar(&r.clusterAddrs, "redis-cluster-addrs", "", "Redis Cluster: some of its nodes, `host:port,...`.")
	fs.StringVar(&r.username, "redis-username", "", "Redis ACL user name.")
	fs.StringVar(&r.password, "redis-password", "", "Redis password; prefer the environment variable to keep it out of ps.")
	fs.StringVar(&r.sentinelPassword, "redis-sentinel-password", "", "Password of the sentinels themselves, if they have one.")
	fs.IntVar(&r.db, "redis-db", 0, "Redis database `number` (single server and Sentinel; Cluster has only 0).")
	fs.BoolVar(&r.tls, "redis-tls", false, "Connect to Redis over TLS (implied by --redis-tls-ca or --redis-tls-cert).")
	r.tlsFiles.caFlag, r.tlsFiles.certFlag, r.tlsFiles.keyFlag = "--redis-tls-ca", "--redis-tls-cert", "--redis-tls-key"
	fs.StringVar(&r.tlsFiles.ca, "redis-tls-ca", "", "PEM CA `file` to verify Redis's certificate. Empty: the system's roots.")
	fs.StringVar(&r.tlsFiles.cert, "redis-tls-cert", "", "PEM client certificate `file` for Redis (needs --redis-tls-key).")
	fs.StringVar(&r.tlsFiles.key, "redis-tls-key", "", "PEM private key `file` of --redis-tls-cert.")
	fs.StringVar(&r.tlsFiles.serverName, "redis-tls-server-name", "", "Server `name` to verify in Redis's certificate. Empty: the host of the address.")
	r.registerPrefix(fs)
}

func (r *redisFlags) registerAddr(fs *flag.FlagSet, help string) {
	fs.StringVar(&r.addr, "redis-addr", "", help)
}

func (r *redisFlags) registerPrefix(fs *flag.FlagSet) {
	fs.StringVar(&r.prefix, "redis-prefix", "fenced:", "Redis key `prefix`.")
}

var redisFlagNames = []string{"redis-addr", "redis-sentinel-addrs", "redis-master", "redis-cluster-addrs", "redis-username",
	"redis-password", "redis-sentinel-password", "redis-db", "redis-tls", "redis-tls-ca", "redis-tls-cert", "redis-tls-key",
	"redis-tls-server-name", "redis-prefix"}

func (r *redisFlags) validate(cmd string) (*redis.UniversalOptions, error) {
	var given []string
	for _, f := range []struct{ name, v string }{{"--redis-addr", r.addr}, {"--redis-sentinel-addrs", r.sentinelAddrs}, {"--redis-cluster-addrs", r.clusterAddrs}} {
		if f.v != "" {
			given = append(given, f.name)
		}
	}
	switch {
	case len(given) == 0:
		return nil, usagef(cmd, "--lease-store=redis needs Redis: one of --redis-addr (single server), --redis-sentinel-addrs with --redis-master (Sentinel), or --redis-cluster-addrs (Cluster); or use --lease-store=etcd")
	case len(given) > 1:
		return nil, usagef(cmd, "%s: give only one Redis topology", strings.Join(given, " and "))
	case (r.sentinelAddrs != "") != (r.master != ""):
		return nil, usagef(cmd, "--redis-sentinel-addrs and --redis-master go together: Sentinel needs both")
	case r.db < 0:
		return nil, usagef(cmd, "--redis-db %d: want >= 0", r.db)
	case r.db != 0 && r.clusterAddrs != "":
		return nil, usagef(cmd, "--redis-db %d with --redis-cluster-addrs: Redis Cluster has only database 0", r.db)
	case lock.ValidateRedisPrefix(r.prefix) != nil:
		return nil, usagef(cmd, "--redis-prefix: %v", strings.TrimPrefix(lock.ValidateRedisPrefix(r.prefix).Error(), "lock: "))
	}
	if err := r.tlsFiles.check(cmd); err != nil {
		return nil, err
	}
	o := &redis.UniversalOptions{
		MasterName: r.master, Username: r.username, Password: r.password,
		SentinelPassword: r.sentinelPassword, DB: r.db,
		IsClusterMode: r.clusterAddrs != "",
		// A call ends at its context's deadline (--backend-timeout), not
		// only at go-redis's own read timeout.
		ContextTimeoutEnabled: true,
	}
	_, flagName, list := r.where()
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, usagef(cmd, "%s: address %q: want host:port", flagName, redact.URL(a))
		} else if err := checkPort(port, 1); err != nil {
			return nil, usagef(cmd, "%s: address %q: %v", flagName, redact.URL(a), err)
		}
		o.Addrs = append(o.Addrs, a)
	}
	if len(o.Addrs) == 0 {
		return nil, usagef(cmd, "%s %q: no address", flagName, list)
	}
	if flagName == "--redis-addr" && len(o.Addrs) > 1 {
		return nil, usagef(cmd, "--redis-addr %q: one server; for several use --redis-sentinel-addrs or --redis-cluster-addrs", list)
	}
	return o, nil
}

// client builds the Redis client: a single-server, Sentinel (failover) or
// Cluster client, each a redis.UniversalClient. Its commands are timed in
// m, go-redis's own log lines go to log, and its dials are watched by the
// dialWatch it returns.
func (r *redisFlags) client(o *redis.UniversalOptions, m *daemonMetrics, log *slog.Logger) (redis.UniversalClient, *dialWatch, error) {
	if r.tls || r.tlsFiles.ca != "" || r.tlsFiles.cert != "" {
		tc, err := r.tlsFiles.client()
		if err != nil {
			return nil, nil, err
		}
		o.TLSConfig = tc
	}
	redis.SetLogger(redisLogger{log})
	rdb := redis.NewUniversalClient(o)
	hook := redisHook{m.redis}
	dw := &dialWatch{flag: r.addrFlag()}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// A Cluster client's hooks see neither its nodes' dials nor the
		// lease store's pipelines, which go to each master's own client
		// (lock/redispipe.go). Every command passes a node's hooks.
		cc.OnNewNode(func(node *redis.Client) {
			node.AddHook(hook)
			node.AddHook(dw)
		})
	} else {
		rdb.AddHook(hook)
		rdb.AddHook(dw)
	}
	return rdb, dw, nil
}

// where says where Redis is: the topology (single, sentinel or cluster),
// the flag that gives its addresses, and their list.
func (r *redisFlags) where() (topology, flag, addrs string) {
	switch {
	case r.sentinelAddrs != "":
		return "sentinel", "--redis-sentinel-addrs", r.sentinelAddrs
	case r.clusterAddrs != "":
		return "cluster", "--redis-cluster-addrs", r.clusterAddrs
	}
	return "single", "--redis-addr", r.addr
}

// addrFlag is the flag that says where Redis is.
func (r *redisFlags) addrFlag() string {
	_, flag, _ := r.where()
	return flag
}

// dialWatch remembers how the Redis client's last dial ended, so that a
// readiness check that runs out of time can say why (ready).
type dialWatch struct {
	flag string // where the address comes from: "--redis-addr", ...

	mu  sync.Mutex
	err error     // of the last dial; nil if it connected
	at  time.Time // when it ended
}

var _ redis.Hook = (*dialWatch)(nil)

func (d *dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		d.mu.Lock()
		d.err, d.at = err, time.Now()
		d.mu.Unlock()
		return conn, err
	}
}

func (d *dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (d *dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// failedSince returns the error of the last dial if it failed at or after t.
func (d *dialWatch) failedSince(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil || d.at.Before(t) {
		return nil
	}
	return d.err
}

// ready is GET /readyz's check of a Redis lease store: its Ping, which
// says why when it ran out of time after a dial failed. go-redis retries a
// dial that fails (five times, with backoff) and then the command, longer
// than --ready-timeout: the check ended with a bare "context deadline
// exceeded", and "connection refused" was only in go-redis's log line.
func (d *dialWatch) ready(store lock.LeaseStore) func(context.Context) error {
	return func(ctx context.Context) error {
		start := time.Now()
		err := store.Ping(ctx)
		var be *lock.BackendError
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &be) || be.Backend != "redis" {
			return err
		}
		derr := d.failedSince(start)
		if derr == nil {
			return err
		}
		return &lock.BackendError{Backend: be.Backend, Op: be.Op, Err: fmt.Errorf(
			"%w (retried until the check's %w); check that Redis runs at %s and that fenced can reach it", derr, be.Err, d.flag)}
	}
}

// topology is single, sentinel or cluster.
func (r *redisFlags) topology() string {
	t, _, _ := r.where()
	return t
}

// warnIfEvicting warns when Redis may evict a held lease before its TTL
// (lock.RedisEvicts): Redis's default is safe, but many managed services
// default to volatile-lru. It does not stop fenced: fencing still holds,
// and the operator decides. A Redis that does not answer yet is for
// /readyz to report.
func warnIfEvicting(ctx context.Context, log *slog.Logger, rdb redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	evicts, policy, err := lock.RedisEvicts(ctx, rdb)
	switch {
	case err != nil:
		log.Debug("could not read Redis's maxmemory-policy", "err", err)
	case evicts:
		log.Warn("Redis may evict held leases: it has a maxmemory and maxmemory-policy "+policy,
			"maxmemory_policy", policy,
			"hint", "set maxmemory-policy noeviction (redis-cli CONFIG SET maxmemory-policy noeviction, and in redis.conf): "+
				"every key fenced writes has a TTL, so "+policy+" can evict a held lease and grant its lock to another holder before the TTL ends; "+
				"fencing tokens still reject the first holder's late writes")
	}
}
