package main

import (
	"context"
	"io"
	"strings"

	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
)

const devSummary = `Run fenced for development in one process that needs nothing else: an
embedded single-member etcd (in a temporary directory removed on exit, or by
the next fenced dev if this one is killed; or in --data-dir to keep tokens
across restarts) issues the tokens and holds the
leases, and the HTTP API listens on --listen. With --redis-addr the leases
live in that Redis instead, with millisecond TTLs, as fenced serve keeps
them.

On stdout: "fenced listening on URL", a curl command to try, where etcd (and
Redis) listen, and the command that runs the Go SDK's quickstart against
them (examples/quickstart in the fenced repository).`

type devOpts struct {
	h      httpFlags
	lf     logFlags
	member embedFlags
	redis  redisFlags
	floor  floorFlags
	prefix string
}

func newDevCommand() (*command, *devOpts) {
	cmd := newCommand("fenced dev", "", devSummary)
	o := &devOpts{}
	o.h.register(cmd.fs)
	cmd.fs.StringVar(&o.member.dataDir, "data-dir", "", "Keep the embedded etcd's data in this `dir`, so that tokens keep increasing across restarts.\nEmpty: a temporary directory removed on exit (or, if fenced is killed\nfirst, by the next fenced dev).")
	cmd.fs.StringVar(&o.member.clientURL, "etcd-client-url", "", "`URL` etcd clients reach the embedded etcd at, http://127.0.0.1:port. Empty: a free loopback port (printed at start).")
	cmd.fs.StringVar(&o.member.listenClientURL, "etcd-listen-client-url", "", "`URL` the embedded etcd listens on for clients, when that is not --etcd-client-url (an IP address or localhost).")
	registerPrefix(cmd.fs, &o.prefix)
	o.redis.registerAddr(cmd.fs, "Keep the leases in this Redis server, `host:port` (millisecond TTLs, as fenced serve does);\ntokens still come from the embedded etcd. Empty: leases in etcd.")
	o.redis.registerPrefix(cmd.fs)
	o.floor.register(cmd.fs)
	o.lf.register(cmd.fs)
	return cmd, o
}

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cmd, o := newDevCommand()
	defer cmd.explainEnv(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	o.member.name, o.member.state, o.member.token = "fenced", "new", "fenced"
	o.member.heartbeat, o.member.election = defaultHeartbeat, defaultElection
	o.member.retention = sequencer.DefaultCompactionRetention
	if err := firstErr(cmd.noArgs(), o.h.validate(cmd.name), o.lf.validate(cmd.name), o.member.validate(cmd.name), validatePrefix(cmd.name, o.prefix), o.floor.validate(cmd)); err != nil {
		return err
	}
	var redisOpts *redis.UniversalOptions
	if o.redis.addr != "" {
		var err error
		if redisOpts, err = o.redis.validate(cmd.name); err != nil {
			return err
		}
	} else if cmd.set["redis-prefix"] { // not by an empty FENCED_REDIS_PREFIX (defect 139)
		return usagef(cmd.name, "--redis-prefix without --redis-addr: leases are in etcd; give --redis-addr to keep them in Redis")
	}
	log, m, c, err := o.h.begin(&o.lf, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	e, err := o.member.start(ctx, log)
	if err != nil {
		return err
	}
	c.add("embedded etcd", e.Close)
	cli, err := embeddedClient(e, m.etcdDialOptions()...)
	if err != nil {
		return err
	}
	c.add("etcd client", cli.Close)
	if err := ensureFloor(ctx, log, cli, o.prefix, o.floor, embeddedEtcdHint); err != nil {
		return err
	}

	st := startup{cmd: "dev", fatal: e.Err(), attrs: []any{"etcd_client_url", e.ClientURL(), "data_dir", e.Dir()}}
	sdk := "sdk: go run ./examples/quickstart --etcd " + e.ClientURL()
	if o.prefix != sequencer.DefaultPrefix {
		sdk += " --etcd-prefix " + shellQuote(o.prefix)
	}
	if redisOpts == nil {
		es, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(o.prefix), lock.WithEtcdLogger(log))
		if err != nil {
			return err
		}
		c.add("etcd lease store", es.Close)
		st.store = es
		st.attrs = append(st.attrs, "lease_store", "etcd")
		st.lines = []string{"etcd: " + e.ClientURL() + " (tokens and leases)", sdk}
	} else {
		rdb, dials, err := o.redis.client(redisOpts, m, log)
		if err != nil {
			return err
		}
		c.add("redis client", rdb.Close)
		seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix(o.prefix), sequencer.WithLogger(log))
		if err != nil {
			return err
		}
		c.add("sequencer", seq.Close)
		rs, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(o.redis.prefix))
		if err != nil {
			return err
		}
		c.add("redis lease store", rs.Close)
		st.store = rs // its Ping checks Redis and the sequencer's etcd
		st.ready = dials.ready(rs)
		warnIfEvicting(ctx, log, rdb)
		sdk += " --redis " + shellQuote(o.redis.addr)
		if o.redis.prefix != "fenced:" {
			sdk += " --redis-prefix " + shellQuote(o.redis.prefix)
		}
		st.attrs = append(st.attrs, "lease_store", "redis", "redis_addr", o.redis.addr)
		st.lines = []string{"etcd: " + e.ClientURL() + " (tokens)", "redis: " + o.redis.addr + " (leases)", sdk}
	}
	return serveLocks(ctx, c, &o.h, m, log, stdout, st)
}

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:/_-=+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
