package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
)

// Client talks to a fenced server. It is safe for concurrent use.
type Client struct {
	base           string // scheme://host[:port][/path], no trailing slash
	hc             *http.Client
	ownHC          bool
	auth           string // the Authorization header, or ""
	maxRequestWait time.Duration

	// locks gives every lease lock.Lease's machinery (validity, keep-alive,
	// Done) over httpStore, which refreshes and releases through the API.
	locks *lock.Client
}

// ClientOption configures a Client.
type ClientOption func(*clientConfig) error

type clientConfig struct {
	hc             *http.Client
	tls            *tls.Config
	token          string
	maxRequestWait time.Duration
}

// DefaultMaxRequestWait is the longest wait_ms one acquire request asks
// for unless WithMaxRequestWait says otherwise.
const DefaultMaxRequestWait = 30 * time.Second

// WithHTTPClient sets the HTTP client. Default: a client of its own with a
// clone of http.DefaultTransport (proxy from the environment, HTTP/2) and
// no overall timeout, since an acquire may wait on the server; every call
// is bounded by its context instead. It cannot be combined with
// WithTLSConfig: configure TLS on hc's transport.
func WithHTTPClient(hc *http.Client) ClientOption {
	return func(c *clientConfig) error {
		if hc == nil {
			return errors.New("client: WithHTTPClient(nil)")
		}
		c.hc = hc
		return nil
	}
}

// WithBearerToken sends Authorization: Bearer tok with every request.
// Default: no Authorization header. The token must be printable ASCII
// without spaces, as the server's token file requires.
func WithBearerToken(tok string) ClientOption {
	return func(c *clientConfig) error {
		if tok == "" {
			return errors.New("client: empty bearer token")
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] < 0x21 || tok[i] > 0x7e {
				return fmt.Errorf("client: bearer token has a byte 0x%02x at %d; want printable ASCII without spaces", tok[i], i)
			}
		}
		c.token = tok
		return nil
	}
}

// WithTLSConfig sets the TLS configuration of the default transport: a
// RootCAs pool for a server certificate signed by a private CA, and
// Certificates for mutual TLS. Default: the system's roots, no client
// certificate.
func WithTLSConfig(cfg *tls.Config) ClientOption {
	return func(c *clientConfig) error {
		if cfg == nil {
			return errors.New("client: WithTLSConfig(nil)")
		}
		c.tls = cfg.Clone()
		return nil
	}
}

// WithMaxRequestWait sets the longest wait_ms that one acquire request asks
// the server for; a longer wait is split into several requests. Default
// DefaultMaxRequestWait (30s). It must not exceed the server's --max-wait
// (60s unless configured), which rejects a longer wait_ms.
func WithMaxRequestWait(d time.Duration) ClientOption {
	return func(c *clientConfig) error {
		if d < time.Millisecond {
			return fmt.Errorf("client: max request wait %s: want at least 1ms", d)
		}
		c.maxRequestWait = d
		return nil
	}
}

// New returns a client of the fenced server at baseURL, such as
// http://127.0.0.1:7070 or https://fenced.example:7070/prefix.
func New(baseURL string, opts ...ClientOption) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q: want http://host:port or https://host:port", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("client: base URL %q: want no user, query or fragment", baseURL)
	}
	cfg := clientConfig{maxRequestWait: DefaultMaxRequestWait}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	c := &Client{
		base:           strings.TrimRight(u.String(), "/"),
		hc:             cfg.hc,
		maxRequestWait: cfg.maxRequestWait,
	}
	c.locks, _ = lock.New(httpStore{c}) // cannot fail: the store is not nil
	if cfg.token != "" {
		c.auth = "Bearer " + cfg.token
	}
	if c.hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if cfg.tls != nil {
			tr.TLSClientConfig = cfg.tls
		}
		c.hc, c.ownHC = &http.Client{Transport: tr}, true
	} else if cfg.tls != nil {
		return nil, errors.New("client: WithTLSConfig and WithHTTPClient together: set the TLS configuration on the HTTP client's transport")
	}
	return c, nil
}

// Option configures one Acquire or TryAcquire.
type Option func(*acquireOpts)

type acquireOpts struct {
	wait      time.Duration
	keepAlive bool
}

// WithWait bounds how long Acquire waits for a held lock before it returns
// an error matching lock.ErrNotAcquired. Default 0: wait until the context
// ends.
func WithWait(d time.Duration) Option { return func(o *acquireOpts) { o.wait = d } }

// WithKeepAlive makes the lease refresh itself every TTL/3 until Release or
// Close. Default off: the lease is lost at its validity deadline unless
// refreshed.
func WithKeepAlive() Option { return func(o *acquireOpts) { o.keepAlive = true } }

// TryAcquire makes one attempt: it returns an error matching
// lock.ErrNotAcquired at once when the lock is held.
func (c *Client) TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	var o acquireOpts
	for _, f := range opts {
		f(&o)
	}
	return c.acquire(ctx, name, ttl, o, true)
}

// Acquire blocks until it holds the lease of name, the context ends (an
// error matching ctx.Err()), or the wait budget of WithWait runs out (an
// error matching lock.ErrNotAcquired). The server does the waiting: each
// request asks it to wait up to WithMaxRequestWait.
//
// When the context ends while a request is in flight, the server may still
// grant a lease that this client never learns of; it expires after its TTL.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	var o acquireOpts
	for _, f := range opts {
		f(&o)
	}
	if o.wait < 0 {
		return nil, fmt.Errorf("client: wait %s: want >= 0", o.wait)
	}
	return c.acquire(ctx, name, ttl, o, false)
}

type acquireBody struct {
	TTLMs  int64 `json:"ttl_ms"`
	WaitMs int64 `json:"wait_ms"`
}

type refreshBody struct {
	LeaseID string `json:"lease_id"`
	TTLMs   int64  `json:"ttl_ms"`
}

type releaseBody struct {
	LeaseID string `json:"lease_id"`
}

type leaseAnswer struct {
	Name    string      `json:"name"`
	LeaseID string      `json:"lease_id"`
	Token   fence.Token `json:"token"`
	TTLMs   int64       `json:"ttl_ms"`
}

type stateAnswer struct {
	Name  string      `json:"name"`
	Held  bool        `json:"held"`
	Token fence.Token `json:"token"`
	TTLMs int64       `json:"ttl_ms"`
}

func (c *Client) acquire(ctx context.Context, name string, ttl time.Duration, o acquireOpts, try bool) (*Lease, error) {
	if err := lock.ValidateName(name); err != nil {
		return nil, err
	}
	if err := lock.ValidateTTL(ttl); err != nil {
		return nil, err
	}
	if ttl%time.Millisecond != 0 {
		return nil, fmt.Errorf("%w: %s; want whole milliseconds", lock.ErrInvalidTTL, ttl)
	}
	var budgetEnd time.Time
	if o.wait > 0 {
		budgetEnd = time.Now().Add(o.wait)
	}
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	backoff := minBackoff
	for {
		var wait time.Duration
		if !try {
			wait = c.maxRequestWait
			if !budgetEnd.IsZero() {
				wait = min(wait, time.Until(budgetEnd))
			}
			if dl, ok := ctx.Deadline(); ok {
				wait = min(wait, time.Until(dl))
			}
			wait = max(wait.Truncate(time.Millisecond), 0)
		}
		start := time.Now()
		var a leaseAnswer
		err := c.do(ctx, http.MethodPost, lockPath(name, "acquire"), acquireBody{TTLMs: ttl.Milliseconds(), WaitMs: wait.Milliseconds()}, &a)
		if err == nil {
			l, err := c.adopt(ctx, name, start, a, o.keepAlive)
			if err == nil || try || !errors.Is(err, lock.ErrNotAcquired) {
				return l, err
			}
			continue // granted with no validity left: released, try again
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("client: acquire %q: %w", name, ctx.Err())
		}
		if !errors.Is(err, lock.ErrNotAcquired) {
			return nil, fmt.Errorf("client: acquire %q: %w", name, err)
		}
		if try || (!budgetEnd.IsZero() && !time.Now().Before(budgetEnd)) {
			return nil, fmt.Errorf("client: acquire %q: %w", name, err)
		}
		// A server that answers held well before the wait it was asked for
		// (a shorter --max-wait, a context deadline) must not be polled in
		// a busy loop.
		if time.Since(start) >= wait/2 && wait > 0 {
			backoff = minBackoff
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("client: acquire %q: %w", name, ctx.Err())
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// adopt turns an acquire answer into a lock.Lease. A lease granted with no
// validity left is released and is an error matching lock.ErrNotAcquired.
func (c *Client) adopt(ctx context.Context, name string, start time.Time, a leaseAnswer, keepAlive bool) (*Lease, error) {
	if a.LeaseID == "" || a.Token == 0 || a.TTLMs <= 0 {
		return nil, fmt.Errorf("client: acquire %q: the server's answer lacks lease_id, token or ttl_ms", name)
	}
	var opts []lock.Option
	if keepAlive {
		opts = append(opts, lock.WithKeepAlive())
	}
	g := lock.Grant{Token: a.Token, TTL: time.Duration(a.TTLMs) * time.Millisecond}
	return c.locks.Adopt(ctx, name, a.LeaseID, g, start, opts...)
}

// Inspect reports who holds name. The server never tells the lease id, so
// State.LeaseID is empty; State.Remaining is the TTL the lease has left.
func (c *Client) Inspect(ctx context.Context, name string) (lock.State, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.State{}, err
	}
	var a stateAnswer
	if err := c.do(ctx, http.MethodGet, lockPath(name, ""), nil, &a); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return lock.State{}, fmt.Errorf("client: inspect %q: %w", name, err)
	}
	return lock.State{Held: a.Held, Token: a.Token, Remaining: time.Duration(a.TTLMs) * time.Millisecond}, nil
}

// Close releases every lease the client still holds and waits for their
// keep-alive goroutines. Later calls return lock.ErrClosed. Close is
// idempotent.
func (c *Client) Close(ctx context.Context) error {
	err := c.locks.Close(ctx)
	if c.ownHC {
		c.hc.CloseIdleConnections()
	}
	return err
}

func lockPath(name, action string) string {
	p := "/v1/locks/" + url.PathEscape(name)
	if action != "" {
		p += "/" + action
	}
	return p
}

// maxAnswer bounds how much of an answer the client reads.
const maxAnswer = 1 << 20

// do sends one request and decodes a 200 answer into out (if not nil). Any
// other status is an *APIError.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("client: encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("client: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("client: reading the answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return apiError(resp.StatusCode, b)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("client: the answer of %s %s is not the JSON expected: %w", method, path, err)
	}
	return nil
}

func apiError(status int, body []byte) *APIError {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err == nil && e.Error.Code != "" {
		return &APIError{Status: status, Code: e.Error.Code, Message: e.Error.Message}
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	return &APIError{Status: status, Message: msg}
}
