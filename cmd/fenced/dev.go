package main

import (
	"context"
	"io"

	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/server"
)

const devSummary = `Run fenced for development in one process that needs nothing else: an
embedded single-member etcd (in a temporary directory removed on exit, or in
--data-dir to keep tokens across restarts) holds both the leases and the
tokens, and the HTTP API listens on --listen. The first line on stdout is
"fenced listening on URL", the second a curl command to try.`

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newCommand("fenced dev", "", devSummary)
	var (
		h      httpFlags
		lf     logFlags
		member embedFlags
		prefix string
	)
	h.register(cmd.fs)
	cmd.fs.StringVar(&member.dataDir, "data-dir", "", "Keep the embedded etcd's data in this `dir`, so that tokens keep increasing across restarts.\nEmpty: a temporary directory removed on exit.")
	cmd.fs.StringVar(&member.clientURL, "etcd-client-url", "", "`URL` the embedded etcd serves clients on, http://127.0.0.1:port, e.g. for fenced admin floor.\nEmpty: a free loopback port (logged at start).")
	registerPrefix(cmd.fs, &prefix)
	lf.register(cmd.fs)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	member.name, member.state, member.token = "fenced", "new", "fenced"
	member.heartbeat, member.election = defaultHeartbeat, defaultElection
	if err := firstErr(cmd.noArgs(), h.validate(cmd.name), lf.validate(cmd.name), member.validate(cmd.name), validatePrefix(cmd.name, prefix)); err != nil {
		return err
	}
	log := lf.logger(stderr)
	tlsCfg, tokens, err := h.load()
	if err != nil {
		return err
	}

	c := &closer{log: log}
	defer c.close()
	e, err := member.start(ctx, log)
	if err != nil {
		return err
	}
	c.add("embedded etcd", e.Close)
	cli, err := e.Client()
	if err != nil {
		return err
	}
	c.add("etcd client", cli.Close)
	if err := ensureFloor(ctx, log, cli, prefix); err != nil {
		return err
	}
	store, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(prefix), lock.WithEtcdLogger(log))
	if err != nil {
		return err
	}
	c.add("etcd lease store", store.Close)
	locks, err := lock.New(store)
	if err != nil {
		return err
	}
	c.add("lock client", func() error { return locks.Close(context.Background()) })
	srv, err := server.New(h.serverConfig(locks, log, tokens))
	if err != nil {
		return err
	}
	a, err := listen(&h, srv, tlsCfg, log)
	if err != nil {
		return err
	}
	a.announce(stdout)
	log.Info("fenced dev ready", "url", a.url, "lease_store", "etcd", "etcd_client_url", e.ClientURL(), "data_dir", e.Dir())
	return a.run(ctx, e.Err())
}
