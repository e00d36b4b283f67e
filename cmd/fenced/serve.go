package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/fenced/fenced/fence"
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
token floor of a new cluster (with --raise-floor, to raise it after a
restore) before any token is issued; a Redis that does
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
	floor      floorFlags
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
	o.floor.register(cmd.fs)
	o.lf.register(cmd.fs)
	return cmd, o
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cmd, o := newServeCommand()
	defer cmd.explainEnv(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	if err := firstErr(cmd.noArgs(), o.h.validate(cmd.name), o.lf.validate(cmd.name), validatePrefix(cmd.name, o.prefix), o.floor.validate(cmd)); err != nil {
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
	hint := externalEtcdHint
	if eps == nil {
		hint = embeddedEtcdHint
	}
	if err := ensureFloor(ctx, log, cli, o.prefix, o.floor, hint); err != nil {
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

// floorFlags are --raise-floor and --min-token of serve and dev.
type floorFlags struct {
	raise bool
	min   fence.Token
}

func (f *floorFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.raise, "raise-floor", false, "Before serving, raise the token floor as fenced admin raise-floor does: every token issued from\n"+
		"now on exceeds --min-token, the highest token etcd has issued and the clock (µs). Use it after\n"+
		"restoring the embedded member's data dir from a snapshot, or when starting on a replacement\n"+
		"cluster: fenced serves as soon as it starts, so admin raise-floor cannot come first (with an\n"+
		"external etcd, fenced admin raise-floor before starting does the same). Harmless left on:\n"+
		"tokens jump forward to the clock at each start.")
	fs.Var(tokenValue{&f.min}, "min-token", "With --raise-floor: every token issued from now on exceeds this `token`, the highest your\n"+
		"resources have seen (safe even against a wrong clock); at most 2^62.")
}

// validate refuses --min-token without --raise-floor, from the command
// line or the environment, and a minimum that no token could exceed.
func (f *floorFlags) validate(cmd *command) error {
	if cmd.set["min-token"] && !f.raise {
		return usagef(cmd.name, "--min-token goes with --raise-floor: give both, or drop --min-token")
	}
	if err := checkMinToken(cmd.name, f.min); err != nil {
		return err
	}
	return nil
}

// ensureFloor sets the token floor of a cluster that never had one before
// any token is issued (sequencer.EnsureFloor), or with --raise-floor raises
// it as fenced admin raise-floor does (sequencer.RaiseFloor), waiting for
// etcd and saying so. dev and serve open their listener only after it
// returned: with an embedded member, etcd runs only inside fenced, so
// admin raise-floor could not run before fenced served (defect 161). It
// returns an error once ctx ends, or at once for an error that no waiting
// mends (a --min-token that leaves no token below 2^63, a floor key that
// is not a number): fenced then exits without serving.
//
// While it waits it logs, after each attempt (up to 5 s, then a second's
// pause), where it asks (the client's
// endpoints), why an endpoint does not answer when a dial says so
// (connection refused, no such host), and hint, what to check: "etcd does
// not answer" alone, with a bare "context deadline exceeded", left the
// operator to guess (docs/design.md, defect 196).
func ensureFloor(ctx context.Context, log *slog.Logger, cli *clientv3.Client, prefix string, ff floorFlags, hint string) error {
	what := "set the token floor in etcd"
	if ff.raise {
		what = "raise the token floor in etcd (--raise-floor)"
	}
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var f sequencer.Floor
		var raised bool
		var err error
		if ff.raise {
			f, err = sequencer.RaiseFloor(tctx, cli, prefix, ff.min)
		} else {
			f, raised, err = sequencer.EnsureFloor(tctx, cli, prefix)
		}
		cancel()
		switch {
		case err == nil && ff.raise:
			log.Info("token floor raised before serving", "next_token", uint64(f.Next), "min_token", uint64(ff.min))
			return nil
		case err == nil:
			if raised {
				log.Info("new etcd cluster: token floor set above every earlier token", "next_token", uint64(f.Next))
			}
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case errors.Is(err, sequencer.ErrTokensExhausted) || errors.Is(err, sequencer.ErrBadFloor) || errors.Is(err, sequencer.ErrMinTokenTooHigh):
			// etcd answered, and asking again gets the same.
			return fmt.Errorf("%s: %w", what, err)
		}
		attrs := []any{"err", err, "etcd_endpoints", strings.Join(cli.Endpoints(), ",")}
		if derr := dialEtcd(ctx, cli.Endpoints()); derr != nil {
			attrs = append(attrs, "dial", derr.Error())
		}
		log.Warn("etcd does not answer; fenced waits for it before serving, since tokens come from it", append(attrs, "hint", hint)...)
		if !clock.Sleep(ctx, time.Second) {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
	}
}

// What to check when etcd does not answer at start: an external
// cluster, or an embedded member (which serves only with a quorum of the
// members of --etcd-initial-cluster).
const (
	externalEtcdHint = "check --etcd-endpoints (FENCED_ETCD_ENDPOINTS), that etcd runs there and that fenced can reach it " +
		"(and --etcd-ca, --etcd-cert, --etcd-username for a cluster that wants them), and its health: " +
		"etcdctl --endpoints=<them> endpoint health"
	embeddedEtcdHint = "the embedded etcd member serves only with a quorum of the members in --etcd-initial-cluster: start the others, " +
		"check that their --etcd-peer-url reach each other, and etcdctl --endpoints=<a member's --etcd-client-url> endpoint status --cluster"
)

// dialEtcd dials each endpoint's address once (a second at most) and
// returns the errors of those that do not connect, or nil if every one
// connects (etcd then answers the connection and not the request: TLS,
// credentials, no leader). The etcd client retries a refused connection
// until the request's deadline, which is all its error says.
func dialEtcd(ctx context.Context, eps []string) error {
	var errs []error
	for _, ep := range eps {
		network, addr := "tcp", ep
		if u, err := url.Parse(ep); err == nil && strings.Contains(ep, "://") {
			addr = u.Host
			if strings.HasPrefix(u.Scheme, "unix") {
				network, addr = "unix", u.Host+u.Path
			}
		}
		d := net.Dialer{Timeout: time.Second}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		conn.Close()
	}
	return errors.Join(errs...)
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
