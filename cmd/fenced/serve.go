package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
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
"fenced listening on URL"; logs go to stderr. SIGHUP reloads
--auth-token-file; SIGTERM or SIGINT shut down gracefully.`

// The Raft timing of embedded members unless flags say otherwise: etcd's own.
const (
	defaultHeartbeat = 100 * time.Millisecond
	defaultElection  = time.Second
)

type serveOpts struct {
	h          httpFlags
	lf         logFlags
	rf         redisFlags
	ef         etcdFlags
	member     embedFlags
	prefix     string
	leaseStore string
}

func newServeCommand() (*command, *serveOpts) {
	cmd := newCommand("fenced serve", "", serveSummary)
	o := &serveOpts{}
	cmd.fs.StringVar(&o.leaseStore, "lease-store", "redis", "Where leases live, `store`: redis (fast; tokens still from etcd) or etcd (no Redis needed).")
	o.h.register(cmd.fs)
	o.rf.register(cmd.fs)
	o.ef.register(cmd.fs, "External etcd cluster for tokens (and leases with --lease-store=etcd): `endpoints`\nhttp(s)://host:port,... Exactly one of --etcd-endpoints and --etcd-data-dir.")
	o.member.register(cmd.fs)
	registerPrefix(cmd.fs, &o.prefix)
	o.lf.register(cmd.fs)
	return cmd, o
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cmd, o := newServeCommand()
	defer cmd.explainEnv(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	if err := firstErr(cmd.noArgs(), o.h.validate(cmd.name), o.lf.validate(cmd.name), validatePrefix(cmd.name, o.prefix)); err != nil {
		return err
	}

	// Leases.
	var redisOpts *redis.UniversalOptions
	switch o.leaseStore {
	case "redis":
		var err error
		if redisOpts, err = o.rf.validate(cmd.name); err != nil {
			return err
		}
	case "etcd":
		if f := cmd.anySet(redisFlagNames); f != "" {
			return usagef(cmd.name, "--%s is set, but --lease-store=etcd keeps leases in etcd: drop it, or use --lease-store=redis", f)
		}
	default:
		return usagef(cmd.name, "--lease-store %q: want redis or etcd", o.leaseStore)
	}

	// Tokens.
	var eps []string
	switch {
	case o.ef.endpoints != "" && o.member.dataDir != "":
		return usagef(cmd.name, "--etcd-endpoints and --etcd-data-dir: give one, an external etcd cluster or an embedded member")
	case o.ef.endpoints != "":
		if f := cmd.anySet(embedFlagNames); f != "" {
			return usagef(cmd.name, "--%s configures an embedded etcd member, but --etcd-endpoints uses an external cluster: drop one", f)
		}
		var err error
		if eps, err = o.ef.validate(cmd.name); err != nil {
			return err
		}
	case o.member.dataDir != "":
		if f := cmd.anySet(externalFlagNames); f != "" {
			return usagef(cmd.name, "--%s configures a client of an external etcd cluster, but --etcd-data-dir runs an embedded member: drop one", f)
		}
		if err := o.member.validate(cmd.name); err != nil {
			return err
		}
	default:
		return usagef(cmd.name, "serve needs etcd for tokens: --etcd-endpoints for an external cluster, or --etcd-data-dir (with --etcd-name, --etcd-peer-url, --etcd-client-url, --etcd-initial-cluster for several nodes) for an embedded member; or run fenced dev")
	}

	log, m, c, err := o.h.begin(&o.lf, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	var rdb redis.UniversalClient
	var dials *dialWatch
	if redisOpts != nil {
		if rdb, dials, err = o.rf.client(redisOpts, m, log); err != nil {
			return err
		}
		c.add("redis client", rdb.Close)
	}
	st := startup{cmd: "serve", attrs: []any{"lease_store", o.leaseStore}}
	var cli *clientv3.Client
	if eps != nil {
		if cli, err = o.ef.client(eps, m.etcdDialOptions()...); err != nil {
			return err
		}
		st.attrs = append(st.attrs, "etcd_endpoints", strings.Join(eps, ","))
	} else {
		e, err := o.member.start(ctx, log)
		if err != nil {
			return err
		}
		c.add("embedded etcd", e.Close)
		st.fatal = e.Err()
		if cli, err = embeddedClient(e, m.etcdDialOptions()...); err != nil {
			return err
		}
		st.attrs = append(st.attrs, "etcd", "embedded", "etcd_name", o.member.name)
	}
	c.add("etcd client", cli.Close)
	if err := ensureFloor(ctx, log, cli, o.prefix); err != nil {
		return err
	}

	if rdb != nil {
		seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix(o.prefix), sequencer.WithLogger(log))
		if err != nil {
			return err
		}
		c.add("sequencer", seq.Close)
		rs, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(o.rf.prefix))
		if err != nil {
			return err
		}
		c.add("redis lease store", rs.Close)
		st.store = rs // its Ping checks Redis and the sequencer's etcd
		st.ready = dials.ready(rs)
		st.attrs = append(st.attrs, "redis", o.rf.topology(), "redis_addrs", strings.Join(redisOpts.Addrs, ","))
		warnIfEvicting(ctx, log, rdb)
	} else {
		es, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(o.prefix), lock.WithEtcdLogger(log))
		if err != nil {
			return err
		}
		c.add("etcd lease store", es.Close)
		st.store = es
	}
	return serveLocks(ctx, c, &o.h, m, log, stdout, st)
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
		if !clock.Sleep(ctx, time.Second) {
			return fmt.Errorf("set the token floor in etcd: %w", ctx.Err())
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
// in the environment, or "". An empty variable, or one of a flag that the
// command line excludes (exclusions), is not given (defect 139).
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
