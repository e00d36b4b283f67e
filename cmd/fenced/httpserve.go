package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/server"
)

// httpFlags configure the HTTP API of dev and serve.
type httpFlags struct {
	listen                       string
	tlsCert, tlsKey, tlsCA       string
	authTokenFile                string
	defaultTTL, maxTTL, maxWait  time.Duration
	backendTimeout, readyTimeout time.Duration
	maxBodyBytes                 int64
	shutdownGrace                time.Duration
}

func (h *httpFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.listen, "listen", "127.0.0.1:7070", "Where the HTTP API listens, `host:port`; port 0 picks a free one. Use 0.0.0.0:7070 to accept other machines.")
	fs.StringVar(&h.tlsCert, "tls-cert", "", "Serve HTTPS with this PEM certificate `file` (needs --tls-key).")
	fs.StringVar(&h.tlsKey, "tls-key", "", "PEM private key `file` of --tls-cert.")
	fs.StringVar(&h.tlsCA, "tls-client-ca", "", "Mutual TLS: require a client certificate signed by a CA in this PEM `file` (needs --tls-cert).")
	fs.StringVar(&h.authTokenFile, "auth-token-file", "", "Require Authorization: Bearer <token> with one of the tokens in this `file`:\none per line, at least 16 printable characters, # starts a comment.\n/healthz and /readyz stay open for probes. Empty: no authentication.")
	fs.DurationVar(&h.defaultTTL, "default-ttl", server.DefaultTTL, "TTL of an acquire or refresh request without ttl_ms.")
	fs.DurationVar(&h.maxTTL, "max-ttl", lock.MaxTTL, "Longest ttl_ms a request may ask for (10ms to 24h).")
	fs.DurationVar(&h.maxWait, "max-wait", server.DefaultMaxWait, "Longest wait_ms an acquire request may ask for.")
	fs.DurationVar(&h.backendTimeout, "backend-timeout", server.DefaultBackendTimeout, "Bound on the Redis and etcd calls of one request, on top of its wait_ms; past it the answer is 503 with Retry-After.")
	fs.DurationVar(&h.readyTimeout, "ready-timeout", server.DefaultReadyTimeout, "Bound on the backend check of GET /readyz; keep it below your probe's timeout (Kubernetes: 1s).")
	fs.Int64Var(&h.maxBodyBytes, "max-body-bytes", server.DefaultMaxBodyBytes, "Largest request body; a larger one is a 413.")
	fs.DurationVar(&h.shutdownGrace, "shutdown-grace", 10*time.Second, "On SIGTERM or SIGINT, how long in-flight requests may take to finish before they are cut off.")
}

func (h *httpFlags) validate(cmd string) error {
	if _, _, err := net.SplitHostPort(h.listen); err != nil {
		return usagef(cmd, "--listen %q: want host:port, e.g. 127.0.0.1:7070 or :7070 (%v)", h.listen, err)
	}
	if (h.tlsCert == "") != (h.tlsKey == "") {
		return usagef(cmd, "--tls-cert and --tls-key go together: give both or neither")
	}
	if h.tlsCA != "" && h.tlsCert == "" {
		return usagef(cmd, "--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS")
	}
	durations := []struct {
		name string
		d    time.Duration
	}{{"default-ttl", h.defaultTTL}, {"max-ttl", h.maxTTL}, {"max-wait", h.maxWait}}
	for _, f := range durations {
		if f.d%time.Millisecond != 0 {
			return usagef(cmd, "--%s %s: want whole milliseconds", f.name, f.d)
		}
	}
	switch {
	case h.maxTTL < lock.MinTTL || h.maxTTL > lock.MaxTTL:
		return usagef(cmd, "--max-ttl %s: want %s to %s", h.maxTTL, lock.MinTTL, lock.MaxTTL)
	case h.defaultTTL < lock.MinTTL || h.defaultTTL > h.maxTTL:
		return usagef(cmd, "--default-ttl %s: want %s to --max-ttl (%s)", h.defaultTTL, lock.MinTTL, h.maxTTL)
	case h.maxWait <= 0:
		return usagef(cmd, "--max-wait %s: want > 0", h.maxWait)
	case h.backendTimeout <= 0:
		return usagef(cmd, "--backend-timeout %s: want > 0", h.backendTimeout)
	case h.readyTimeout <= 0:
		return usagef(cmd, "--ready-timeout %s: want > 0", h.readyTimeout)
	case h.maxBodyBytes < 256:
		return usagef(cmd, "--max-body-bytes %d: want at least 256", h.maxBodyBytes)
	case h.shutdownGrace < 0:
		return usagef(cmd, "--shutdown-grace %s: want >= 0", h.shutdownGrace)
	}
	return nil
}

// load reads the files the flags name: TLS certificate and key, client
// CA, auth tokens. Errors name the flag.
func (h *httpFlags) load() (*tls.Config, [][]byte, error) {
	var tokens [][]byte
	if h.authTokenFile != "" {
		var err error
		if tokens, err = server.LoadTokens(h.authTokenFile); err != nil {
			return nil, nil, fmt.Errorf("--auth-token-file: %w", err)
		}
	}
	if h.tlsCert == "" {
		return nil, tokens, nil
	}
	cert, err := tls.LoadX509KeyPair(h.tlsCert, h.tlsKey)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", h.tlsCert, h.tlsKey, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if h.tlsCA != "" {
		pool, err := loadCertPool(h.tlsCA)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, tokens, nil
}

func loadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s has no PEM certificate", path)
	}
	return pool, nil
}

func (h *httpFlags) serverConfig(locks *lock.Client, log *slog.Logger, tokens [][]byte) server.Config {
	return server.Config{
		Locks: locks, Logger: log, AuthTokens: tokens,
		MaxBodyBytes: h.maxBodyBytes, MaxTTL: h.maxTTL, DefaultTTL: h.defaultTTL,
		MaxWait: h.maxWait, BackendTimeout: h.backendTimeout, ReadyTimeout: h.readyTimeout,
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
func listen(h *httpFlags, handler http.Handler, tlsCfg *tls.Config, log *slog.Logger) (*api, error) {
	ln, err := net.Listen("tcp", h.listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("--listen %s: the address is in use (another fenced?): stop that process, or pick another port, or --listen 127.0.0.1:0 for a free one: %w", h.listen, err)
		}
		return nil, fmt.Errorf("--listen %s: %w", h.listen, err)
	}
	scheme := "http"
	if tlsCfg != nil {
		ln, scheme = tls.NewListener(ln, tlsCfg), "https"
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

// announce prints the first line, where the API listens, and a curl line
// to try.
func (a *api) announce(w io.Writer) {
	fmt.Fprintf(w, "fenced listening on %s\n", a.url)
	extra := ""
	if a.h.authTokenFile != "" {
		extra += ` -H "Authorization: Bearer $TOKEN"`
	}
	if a.h.tlsCert != "" {
		extra += " --cacert CA.pem"
		if a.h.tlsCA != "" {
			extra += " --cert CLIENT.pem --key CLIENT-KEY.pem"
		}
	}
	fmt.Fprintf(w, "try: curl -X POST%s %s/v1/locks/demo/acquire -d '{\"ttl_ms\":10000}'\n", extra, a.url)
}

// run serves until ctx ends (a signal: a clean shutdown), the HTTP server
// fails, or fatal (the embedded etcd) reports an error. It then stops
// accepting connections, lets in-flight requests finish for
// --shutdown-grace, cuts the rest off, and waits for Serve.
func (a *api) run(ctx context.Context, fatal <-chan error) error {
	var runErr error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down: no new connections; in-flight requests may finish", "cause", context.Cause(ctx), "grace", a.h.shutdownGrace)
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
