package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/server"
	"github.com/prometheus/client_golang/prometheus"
)

// httpFlags configure the HTTP API of dev and serve.
type httpFlags struct {
	listen                       string
	tls                          tlsFiles
	authTokenFile                string
	defaultTTL, maxTTL, maxWait  time.Duration
	backendTimeout, readyTimeout time.Duration
	maxBodyBytes                 int64
	shutdownGrace                time.Duration

	// Loaded by load.
	served *servedTLS // nil without --tls-cert
	tokens *server.Tokens

	hup chan os.Signal // SIGHUP, caught since catchHUP; nil before
}

// catchHUP catches SIGHUP from now on: uncaught, Go's default for it ended
// fenced, and a reload (the systemd unit's ExecReload) while fenced starts,
// which lasts as long as etcd is down, killed it, and systemd, which
// counts SIGHUP as a clean end, did not restart it. One that comes before
// fenced serves is kept: reloadOnHUP reloads the tokens for it then. stop
// stops catching.
func (h *httpFlags) catchHUP() (stop func()) {
	h.hup = make(chan os.Signal, 1)
	signal.Notify(h.hup, syscall.SIGHUP)
	hup := h.hup
	return func() { signal.Stop(hup) }
}

func (h *httpFlags) register(fs *flag.FlagSet) {
	h.tls.certFlag, h.tls.keyFlag, h.tls.caFlag = "--tls-cert", "--tls-key", "--tls-client-ca"
	fs.StringVar(&h.listen, "listen", "127.0.0.1:7070", "Where the HTTP API listens, `host:port`; port 0 picks a free one. Use 0.0.0.0:7070 to accept other machines.")
	fs.StringVar(&h.tls.cert, "tls-cert", "", "Serve HTTPS with this PEM certificate `file` (needs --tls-key).")
	fs.StringVar(&h.tls.key, "tls-key", "", "PEM private key `file` of --tls-cert.")
	fs.StringVar(&h.tls.ca, "tls-client-ca", "", "Mutual TLS: require a client certificate signed by a CA in this PEM `file` (needs --tls-cert).")
	fs.StringVar(&h.authTokenFile, "auth-token-file", "", "Require Authorization: Bearer <token> with one of the tokens in this `file`:\none per line, at least 16 printable characters, # starts a comment. A token alone on\nits line may do everything; name=NAME prefixes=P1,P2 allow=acquire,inspect,force-release,metrics\nafter it narrow it. Reloaded on SIGHUP. /healthz and /readyz stay open. Empty: no authentication.")
	fs.DurationVar(&h.defaultTTL, "default-ttl", server.DefaultTTL, "TTL of an acquire or refresh request without ttl_ms (10ms to --max-ttl).")
	fs.DurationVar(&h.maxTTL, "max-ttl", lock.MaxTTL, "Longest ttl_ms a request may ask for (10ms to 24h; at least --default-ttl).")
	fs.DurationVar(&h.maxWait, "max-wait", server.DefaultMaxWait, "Longest wait_ms an acquire request may ask for.")
	fs.DurationVar(&h.backendTimeout, "backend-timeout", server.DefaultBackendTimeout, "Bound on the Redis and etcd calls of one request, on top of its wait_ms; past it the answer is 503 with Retry-After.")
	fs.DurationVar(&h.readyTimeout, "ready-timeout", server.DefaultReadyTimeout, "Bound on the backend check of GET /readyz; keep it below your probe's timeout (Kubernetes: 1s).")
	fs.Int64Var(&h.maxBodyBytes, "max-body-bytes", server.DefaultMaxBodyBytes, "Largest request body, at least 4096; a larger one is a 413.")
	fs.DurationVar(&h.shutdownGrace, "shutdown-grace", 10*time.Second, "On SIGTERM or SIGINT, how long in-flight requests may take to finish before they are cut off.\nRequests that wait (wait_ms, election long polls) are answered 503 with Retry-After at once.")
}

// configFlags maps server.Config's fields to the flags that set them.
var configFlags = map[string]string{
	"MaxTTL": "--max-ttl", "DefaultTTL": "--default-ttl", "MaxWait": "--max-wait",
	"BackendTimeout": "--backend-timeout", "ReadyTimeout": "--ready-timeout", "MaxBodyBytes": "--max-body-bytes",
}

// validate checks the flags of the HTTP API. The limits are server.New's
// to judge: its *server.ConfigError is told in terms of the flag.
func (h *httpFlags) validate(cmd string) error {
	if _, port, err := net.SplitHostPort(h.listen); err != nil {
		return usagef(cmd, "--listen %q: want host:port, e.g. 127.0.0.1:7070 or :7070 (%v)", h.listen, err)
	} else if err := checkPort(port, 0); err != nil {
		return usagef(cmd, "--listen %q: %v (0 picks a free one)", h.listen, err)
	}
	if err := h.tls.check(cmd); err != nil {
		return err
	}
	if h.tls.ca != "" && h.tls.cert == "" {
		return usagef(cmd, "--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS")
	}
	if h.shutdownGrace < 0 {
		return usagef(cmd, "--shutdown-grace %s: want >= 0", h.shutdownGrace)
	}
	for _, f := range []struct {
		flag string
		d    time.Duration
	}{{"--max-wait", h.maxWait}, {"--backend-timeout", h.backendTimeout}, {"--ready-timeout", h.readyTimeout}} {
		if f.d <= 0 { // 0 would mean the server's default: say so rather than surprise
			return usagef(cmd, "%s %s: want > 0", f.flag, f.d)
		}
	}
	if h.maxBodyBytes < server.MinMaxBodyBytes {
		return usagef(cmd, "--max-body-bytes %d: want at least %d, the API's largest request with room to spare", h.maxBodyBytes, server.MinMaxBodyBytes)
	}
	// The TTLs are checked here, not left to server.Config.Check: a 0 there
	// means the default (24h, 30s), and its message names Config fields.
	if h.maxTTL < lock.MinTTL || h.maxTTL > lock.MaxTTL {
		return usagef(cmd, "--max-ttl %s: want %s to %s", h.maxTTL, lock.MinTTL, lock.MaxTTL)
	}
	if h.defaultTTL < lock.MinTTL {
		return usagef(cmd, "--default-ttl %s: want %s to %s (--max-ttl)", h.defaultTTL, lock.MinTTL, h.maxTTL)
	}
	if h.defaultTTL > h.maxTTL {
		return usagef(cmd, "--default-ttl %s is above --max-ttl %s: lower --default-ttl or raise --max-ttl", h.defaultTTL, h.maxTTL)
	}
	var ce *server.ConfigError
	if err := h.serverConfig(nil, nil, nil, nil).Check(); errors.As(err, &ce) {
		name := configFlags[ce.Field]
		if name == "" {
			name = "Config." + ce.Field
		}
		return usagef(cmd, "%s %v: %s", name, ce.Value, ce.Want)
	} else if err != nil {
		return usagef(cmd, "%v", err)
	}
	return nil
}

// load reads the files the flags name: TLS certificate and key, client
// CA, auth tokens. Errors name the flag.
func (h *httpFlags) load(log *slog.Logger) error {
	if h.authTokenFile != "" {
		t, err := server.LoadTokens(h.authTokenFile)
		if err != nil {
			return fmt.Errorf("--auth-token-file: %w", err)
		}
		h.tokens = t
	}
	if h.tls.cert != "" {
		s, err := newServedTLS(h.tls, log)
		if err != nil {
			return err
		}
		h.served = s
	}
	return nil
}

func (h *httpFlags) serverConfig(locks *lock.Client, ready func(context.Context) error, log *slog.Logger, reg *prometheus.Registry) server.Config {
	cfg := server.Config{
		Locks: locks, Ready: ready, Logger: log, Tokens: h.tokens,
		MaxBodyBytes: h.maxBodyBytes, MaxTTL: h.maxTTL, DefaultTTL: h.defaultTTL,
		MaxWait: h.maxWait, BackendTimeout: h.backendTimeout, ReadyTimeout: h.readyTimeout,
	}
	if reg != nil {
		cfg.Registerer, cfg.Gatherer = reg, reg
	}
	return cfg
}

// startup is what dev or serve built before serving: the lease store, and
// what to tell the user and the log.
type startup struct {
	cmd   string // "dev" or "serve"
	store lock.LeaseStore
	ready func(context.Context) error // GET /readyz's check; nil: store.Ping
	fatal <-chan error                // the embedded etcd's failure; nil without one
	lines []string                    // printed after the curl line
	attrs []any                       // of the ready log line
}

// serveLocks is the startup tail of dev and serve: a lock client over the
// store, the API server, the listener, the lines on stdout and the ready
// log line; then it serves until ctx ends or fatal reports, reloading the
// auth tokens on SIGHUP.
func serveLocks(ctx context.Context, c *closer, h *httpFlags, m *daemonMetrics, log *slog.Logger, stdout io.Writer, st startup) error {
	locks, err := lock.New(st.store)
	if err != nil {
		return err
	}
	c.add("lock client", func() error { return locks.Close(context.Background()) })
	if st.ready == nil {
		st.ready = st.store.Ping
	}
	cfg := h.serverConfig(locks, st.ready, log, m.reg)
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	checkBackends(ctx, log, st.ready)
	stopReload := h.reloadOnHUP(log, srv)
	defer stopReload()
	a, err := listen(h, srv, log)
	if err != nil {
		return err
	}
	// Shutdown, once it has closed the listener, ends every wait: waiting
	// acquires and long polls answer 503 with Retry-After at once, rather
	// than hold the shutdown for the whole grace and then be cut off.
	a.srv.RegisterOnShutdown(srv.Drain)
	a.announce(stdout, st.lines)
	log.Info("fenced "+st.cmd+" ready", append([]any{"version", buildVersion(), "url", a.url}, st.attrs...)...)
	return a.run(ctx, st.fatal)
}

// checkBackends checks the backends once at start and warns if they are
// not ready, with what to do about it: fenced still starts, and /readyz
// reports them until they are. A backend that answered with a refusal (a
// wrong password or database: docs/design.md, defect 195) does not stop
// it either: the same refusal later, as when Redis restarts with another
// requirepass, only makes /readyz 503, and the operator may mend it on
// the backend's side (CONFIG SET, ACL SETUSER) without restarting fenced.
func checkBackends(ctx context.Context, log *slog.Logger, ready func(context.Context) error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := ready(ctx); err != nil {
		hint, refused := server.BackendHint(err)
		what := "a backend is not ready yet (it does not answer, or refuses writes); GET /readyz is 503 until it is"
		if refused {
			what = "a backend answers but refuses fenced; GET /readyz is 503 until the setting named in the hint is fixed"
		}
		log.Warn(what, "err", err, "hint", hint)
	}
}

// reloadOnHUP reloads --auth-token-file and the TLS certificate on every
// SIGHUP until stop is called. A file that does not load leaves what was
// in force as it was, and the log says why. With neither, SIGHUP is logged
// and otherwise ignored (it does not end fenced).
func (h *httpFlags) reloadOnHUP(log *slog.Logger, srv *server.Server) (stop func()) {
	hup := h.hup // caught since the start, and a SIGHUP then is in it
	if hup == nil {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by stop
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-hup:
			}
			if h.authTokenFile == "" && h.served == nil {
				log.Info("SIGHUP: nothing to reload (no --auth-token-file, no --tls-cert)")
				continue
			}
			if h.served != nil {
				_ = h.served.reload("SIGHUP") // logged either way
			}
			if h.authTokenFile == "" {
				continue
			}
			t, err := server.LoadTokens(h.authTokenFile)
			if err == nil {
				err = srv.SetTokens(t)
			}
			if err != nil {
				log.Error("SIGHUP: auth tokens not reloaded; the tokens loaded before stay in force", "file", h.authTokenFile, "err", err)
				continue
			}
			log.Info("SIGHUP: auth tokens reloaded", "file", h.authTokenFile, "tokens", t.Len())
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		wg.Wait()
	}
}

// api is a running HTTP server.
type api struct {
	srv  *http.Server
	ln   net.Listener
	url  string
	errc chan error // Serve's result
	log  *slog.Logger
	h    *httpFlags
}

// listen binds the API's address and starts serving handler.
func listen(h *httpFlags, handler http.Handler, log *slog.Logger) (*api, error) {
	ln, err := net.Listen("tcp", h.listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("--listen %s: the address is in use (another fenced?): stop that process, or pick another port, or --listen 127.0.0.1:0 for a free one: %w", h.listen, err)
		}
		return nil, fmt.Errorf("--listen %s: %w", h.listen, err)
	}
	scheme := "http"
	if h.served != nil {
		ln, scheme = tls.NewListener(ln, h.served.listener()), "https"
	}
	a := &api{
		ln: ln, url: scheme + "://" + ln.Addr().String(), errc: make(chan error, 1), log: log, h: h,
		srv: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			// An acquire may wait up to --max-wait plus --backend-timeout.
			WriteTimeout:   h.maxWait + h.backendTimeout + 10*time.Second,
			IdleTimeout:    2 * time.Minute,
			MaxHeaderBytes: 64 << 10,
			ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}
	go func() { a.errc <- a.srv.Serve(ln) }() // ended by shutdown, which waits for it
	return a, nil
}

// announce prints the first line, where the API listens, a curl line to
// try, and lines.
func (a *api) announce(w io.Writer, lines []string) {
	fmt.Fprintf(w, "fenced listening on %s\n", a.url)
	extra := ""
	if a.h.authTokenFile != "" {
		extra += ` -H "Authorization: Bearer $TOKEN"`
	}
	if a.h.tls.cert != "" {
		extra += " --cacert CA.pem"
		if a.h.tls.ca != "" {
			extra += " --cert CLIENT.pem --key CLIENT-KEY.pem"
		}
	}
	fmt.Fprintf(w, "try: curl -X POST%s %s/v1/locks/demo/acquire -d '{\"ttl_ms\":10000}'\n", extra, a.url)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

// run serves until ctx ends (a signal: a clean shutdown), the HTTP server
// fails, or fatal (the embedded etcd) reports an error. It then stops
// accepting connections, answers every wait (wait_ms, long polls) 503 at
// once, lets the other in-flight requests finish for --shutdown-grace,
// cuts the rest off, and waits for Serve.
func (a *api) run(ctx context.Context, fatal <-chan error) error {
	var runErr error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down: no new connections; waiting requests answered 503; in-flight requests may finish", "cause", context.Cause(ctx), "grace", a.h.shutdownGrace)
	case err := <-a.errc:
		return fmt.Errorf("HTTP server: %w", err)
	case err := <-fatal:
		runErr = fmt.Errorf("embedded etcd failed: %w", err)
		a.log.Error("embedded etcd failed; shutting down", "err", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), a.h.shutdownGrace)
	defer cancel()
	if err := a.srv.Shutdown(sctx); err != nil {
		a.log.Warn("in-flight requests cut off after the shutdown grace", "grace", a.h.shutdownGrace, "err", err)
		_ = a.srv.Close() // the connections are gone either way
	}
	if err := <-a.errc; !errors.Is(err, http.ErrServerClosed) && runErr == nil {
		runErr = fmt.Errorf("HTTP server: %w", err)
	}
	return runErr
}

// closer closes what a command opened, in reverse order. A failure to
// close is logged, not returned: the command's work is done by then.
type closer struct {
	fns []func()
	log *slog.Logger
}

func (c *closer) add(name string, fn func() error) {
	c.fns = append(c.fns, func() {
		if err := fn(); err != nil {
			c.log.Warn("close failed", "what", name, "err", err)
		}
	})
}

func (c *closer) close() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}

// begin sets up what fenced dev and serve share before their stores:
// SIGHUP caught first (their start waits for etcd), the logger, the token
// file and TLS loaded, the metrics, and the closer that stops what is added
// to it in reverse, the SIGHUP handler last. The caller closes it.
func (h *httpFlags) begin(lf *logFlags, stderr io.Writer) (*slog.Logger, *daemonMetrics, *closer, error) {
	stopHUP := h.catchHUP()
	log := lf.logger(stderr)
	c := &closer{log: log}
	c.add("SIGHUP handler", func() error { stopHUP(); return nil })
	if err := h.load(log); err != nil {
		c.close()
		return nil, nil, nil, err
	}
	m, err := newDaemonMetrics()
	if err == nil && h.served != nil {
		err = m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fenced_tls_certificate_expiry_timestamp_seconds",
			Help: "When the TLS certificate in force (--tls-cert) expires, in Unix seconds: alert well before; fenced reloads it when its files change, and on SIGHUP.",
		}, func() float64 { return float64(h.served.notAfter().Unix()) }))
	}
	if err != nil {
		c.close()
		return nil, nil, nil, err
	}
	return log, m, c, nil
}
