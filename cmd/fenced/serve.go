package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/fenced/fenced/server"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const serveSummary = `Run fenced for real deployments. Leases live in Redis (--lease-store=redis,
the default: one of --redis-addr, --redis-sentinel-addrs with --redis-master,
or --redis-cluster-addrs) or in etcd (--lease-store=etcd, no Redis needed).
Tokens come from etcd: an external cluster (--etcd-endpoints), or an etcd
member embedded in this process (--etcd-data-dir), so that three fenced
nodes form one Raft cluster. fenced waits for etcd at start, to set the
token floor of a new cluster before any token is issued; a Redis that does
not answer is not fatal: GET /readyz reports it. The first line on stdout is
"fenced listening on URL"; logs go to stderr.`

// The Raft timing of embedded members unless flags say otherwise: etcd's own.
const (
	defaultHeartbeat = 100 * time.Millisecond
	defaultElection  = time.Second
)

// redisFlags configure the Redis client of --lease-store=redis.
type redisFlags struct {
	addr, sentinelAddrs, master, clusterAddrs string
	username, password, sentinelPassword      string
	db                                        int
	tls                                       bool
	tlsCA, tlsCert, tlsKey, tlsServerName     string
	prefix                                    string
}

func (r *redisFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.addr, "redis-addr", "", "A single Redis server, `host:port`.")
	fs.StringVar(&r.sentinelAddrs, "redis-sentinel-addrs", "", "Redis Sentinel: the sentinels, `host:port,...` (needs --redis-master).")
	fs.StringVar(&r.master, "redis-master", "", "Redis Sentinel: the master `name` the sentinels watch.")
	fs.StringVar(&r.clusterAddrs, "redis-cluster-addrs", "", "Redis Cluster: some of its nodes, `host:port,...`.")
	fs.StringVar(&r.username, "redis-username", "", "Redis ACL user name.")
	fs.StringVar(&r.password, "redis-password", "", "Redis password; prefer the environment variable to keep it out of ps.")
	fs.StringVar(&r.sentinelPassword, "redis-sentinel-password", "", "Password of the sentinels themselves, if they have one.")
	fs.IntVar(&r.db, "redis-db", 0, "Redis database `number` (single server and Sentinel; Cluster has only 0).")
	fs.BoolVar(&r.tls, "redis-tls", false, "Connect to Redis over TLS (implied by --redis-tls-ca or --redis-tls-cert).")
	fs.StringVar(&r.tlsCA, "redis-tls-ca", "", "PEM CA `file` to verify Redis's certificate. Empty: the system's roots.")
	fs.StringVar(&r.tlsCert, "redis-tls-cert", "", "PEM client certificate `file` for Redis (needs --redis-tls-key).")
	fs.StringVar(&r.tlsKey, "redis-tls-key", "", "PEM private key `file` of --redis-tls-cert.")
	fs.StringVar(&r.tlsServerName, "redis-tls-server-name", "", "Server `name` to verify in Redis's certificate. Empty: the host of the address.")
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
	case (r.tlsCert == "") != (r.tlsKey == ""):
		return nil, usagef(cmd, "--redis-tls-cert and --redis-tls-key go together: give both or neither")
	case r.prefix == "":
		return nil, usagef(cmd, "--redis-prefix: want a non-empty prefix")
	}
	o := &redis.UniversalOptions{
		MasterName: r.master, Username: r.username, Password: r.password,
		SentinelPassword: r.sentinelPassword, DB: r.db,
		IsClusterMode: r.clusterAddrs != "",
	}
	flagName, list := "--redis-addr", r.addr
	if r.sentinelAddrs != "" {
		flagName, list = "--redis-sentinel-addrs", r.sentinelAddrs
	} else if r.clusterAddrs != "" {
		flagName, list = "--redis-cluster-addrs", r.clusterAddrs
	}
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, usagef(cmd, "%s: address %q: want host:port", flagName, a)
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
// Cluster client, each a redis.UniversalClient.
func (r *redisFlags) client(o *redis.UniversalOptions) (redis.UniversalClient, error) {
	if r.tls || r.tlsCA != "" || r.tlsCert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.tlsServerName}
		if r.tlsCA != "" {
			pool, err := loadCertPool(r.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--redis-tls-ca: %w", err)
			}
			tc.RootCAs = pool
		}
		if r.tlsCert != "" {
			c, err := tls.LoadX509KeyPair(r.tlsCert, r.tlsKey)
			if err != nil {
				return nil, fmt.Errorf("--redis-tls-cert %s, --redis-tls-key %s: %w", r.tlsCert, r.tlsKey, err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		o.TLSConfig = tc
	}
	return redis.NewUniversalClient(o), nil
}

func (r *redisFlags) topology() string {
	switch {
	case r.sentinelAddrs != "":
		return "sentinel"
	case r.clusterAddrs != "":
		return "cluster"
	}
	return "single"
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newCommand("fenced serve", "", serveSummary)
	var (
		h          httpFlags
		lf         logFlags
		rf         redisFlags
		ef         etcdFlags
		member     embedFlags
		prefix     string
		leaseStore string
	)
	cmd.fs.StringVar(&leaseStore, "lease-store", "redis", "Where leases live, `store`: redis (fast; tokens still from etcd) or etcd (no Redis needed).")
	h.register(cmd.fs)
	rf.register(cmd.fs)
	ef.register(cmd.fs, "External etcd cluster for tokens (and leases with --lease-store=etcd): `endpoints`\nhttp(s)://host:port,... Exactly one of --etcd-endpoints and --etcd-data-dir.")
	member.register(cmd.fs)
	registerPrefix(cmd.fs, &prefix)
	lf.register(cmd.fs)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	if err := firstErr(cmd.noArgs(), h.validate(cmd.name), lf.validate(cmd.name), validatePrefix(cmd.name, prefix)); err != nil {
		return err
	}

	// Leases.
	var redisOpts *redis.UniversalOptions
	switch leaseStore {
	case "redis":
		var err error
		if redisOpts, err = rf.validate(cmd.name); err != nil {
			return err
		}
	case "etcd":
		if f := cmd.anySet(redisFlagNames); f != "" {
			return usagef(cmd.name, "--%s is set, but --lease-store=etcd keeps leases in etcd: drop it, or use --lease-store=redis", f)
		}
	default:
		return usagef(cmd.name, "--lease-store %q: want redis or etcd", leaseStore)
	}

	// Tokens.
	var eps []string
	switch {
	case ef.endpoints != "" && member.dataDir != "":
		return usagef(cmd.name, "--etcd-endpoints and --etcd-data-dir: give one, an external etcd cluster or an embedded member")
	case ef.endpoints != "":
		if f := cmd.anySet(embedFlagNames); f != "" {
			return usagef(cmd.name, "--%s configures an embedded etcd member, but --etcd-endpoints uses an external cluster: drop one", f)
		}
		var err error
		if eps, err = ef.validate(cmd.name); err != nil {
			return err
		}
	case member.dataDir != "":
		if f := cmd.anySet(externalFlagNames); f != "" {
			return usagef(cmd.name, "--%s configures a client of an external etcd cluster, but --etcd-data-dir runs an embedded member: drop one", f)
		}
		if err := member.validate(cmd.name); err != nil {
			return err
		}
	default:
		return usagef(cmd.name, "serve needs etcd for tokens: --etcd-endpoints for an external cluster, or --etcd-data-dir (with --etcd-name, --etcd-peer-url, --etcd-client-url, --etcd-initial-cluster for several nodes) for an embedded member; or run fenced dev")
	}

	log := lf.logger(stderr)
	tlsCfg, tokens, err := h.load()
	if err != nil {
		return err
	}
	var rdb redis.UniversalClient
	if redisOpts != nil {
		if rdb, err = rf.client(redisOpts); err != nil {
			return err
		}
	}

	c := &closer{log: log}
	defer c.close()
	if rdb != nil {
		c.add("redis client", rdb.Close)
	}
	var (
		cli   *clientv3.Client
		fatal <-chan error
	)
	if eps != nil {
		if cli, err = ef.client(eps); err != nil {
			return err
		}
	} else {
		e, err := member.start(ctx, log)
		if err != nil {
			return err
		}
		c.add("embedded etcd", e.Close)
		fatal = e.Err()
		if cli, err = e.Client(); err != nil {
			return err
		}
	}
	c.add("etcd client", cli.Close)
	if err := ensureFloor(ctx, log, cli, prefix); err != nil {
		return err
	}

	var store lock.LeaseStore
	if rdb != nil {
		seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix(prefix), sequencer.WithLogger(log))
		if err != nil {
			return err
		}
		c.add("sequencer", seq.Close)
		rs, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(rf.prefix))
		if err != nil {
			return err
		}
		c.add("redis lease store", rs.Close)
		store = rs // its Ping checks Redis and the sequencer's etcd
	} else {
		es, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(prefix), lock.WithEtcdLogger(log))
		if err != nil {
			return err
		}
		c.add("etcd lease store", es.Close)
		store = es
	}
	locks, err := lock.New(store)
	if err != nil {
		return err
	}
	c.add("lock client", func() error { return locks.Close(context.Background()) })
	srv, err := server.New(h.serverConfig(locks, log, tokens))
	if err != nil {
		return err
	}
	checkBackends(ctx, log, store)
	a, err := listen(&h, srv, tlsCfg, log)
	if err != nil {
		return err
	}
	a.announce(stdout)
	attrs := []any{"url", a.url, "lease_store", leaseStore}
	if rdb != nil {
		attrs = append(attrs, "redis", rf.topology(), "redis_addrs", strings.Join(redisOpts.Addrs, ","))
	}
	if eps != nil {
		attrs = append(attrs, "etcd_endpoints", strings.Join(eps, ","))
	} else {
		attrs = append(attrs, "etcd", "embedded", "etcd_name", member.name)
	}
	log.Info("fenced serve ready", attrs...)
	return a.run(ctx, fatal)
}

// checkBackends pings the backends once at start and warns if they do not
// answer: fenced still starts, and /readyz reports them until they do.
func checkBackends(ctx context.Context, log *slog.Logger, store lock.LeaseStore) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		log.Warn("a backend does not answer yet; GET /readyz is 503 until it does", "err", err)
	}
}

// ensureFloor sets the token floor of a cluster that never had one before
// any token is issued (sequencer.EnsureFloor), waiting for etcd and saying so.
func ensureFloor(ctx context.Context, log *slog.Logger, cli *clientv3.Client, prefix string) error {
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		f, raised, err := sequencer.EnsureFloor(tctx, cli, prefix)
		cancel()
		if err == nil {
			if raised {
				log.Info("new etcd cluster: token floor set above every earlier token", "next_token", uint64(f.Next))
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("set the token floor in etcd: %w", ctx.Err())
		}
		log.Warn("etcd does not answer; fenced waits for it before serving, since tokens come from it", "err", err)
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("set the token floor in etcd: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func validatePrefix(cmd, prefix string) error {
	if prefix == "" || !strings.HasPrefix(prefix, "/") || !strings.HasSuffix(prefix, "/") {
		return usagef(cmd, "--etcd-prefix %q: want a key prefix that starts and ends with /, like %s", prefix, sequencer.DefaultPrefix)
	}
	return nil
}

// anySet returns the first of names that was given on the command line or
// in the environment, or "".
func (c *command) anySet(names []string) string {
	for _, n := range names {
		if c.set[n] {
			return n
		}
	}
	return ""
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
