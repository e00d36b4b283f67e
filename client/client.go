package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/internal/calls"
	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/internal/redact"
	"github.com/fenced/fenced/lock"
)

// Client talks to fenced servers: one, or several that share their
// backends. It implements lock.Locker and is safe for concurrent use.
type Client struct {
	urls           []string     // scheme://host[:port][/path], no trailing slash
	cur            atomic.Int32 // index of the server to try first: the last that answered
	hc             *http.Client
	ownHC          bool
	auth           string // the Authorization header, or ""
	maxRequestWait time.Duration
	answerGrace    time.Duration
	retries        int
	// allowedWait, once a server refused maxRequestWait (refusedWait), is
	// the longest wait_ms the client asks for; 0 before.
	allowedWait atomic.Int64
	// calls are the acquisitions in progress, which Close ends (cause
	// lock.ErrClosed) and waits for, and their give-ups (giveUp).
	calls    calls.Set
	givingUp atomic.Int32 // give-ups running

	// leases gives every lease lock.Lease's machinery (validity,
	// keep-alive, Done) over keeper, which refreshes and releases through
	// the API.
	leases *lock.LeaseSet
}

var _ lock.Locker = (*Client)(nil)

// Option configures a Client.
type Option func(*config) error

type config struct {
	hc             *http.Client
	tls            *tls.Config
	token          string
	maxRequestWait time.Duration
	answerGrace    time.Duration
	retries        int
}

// DefaultMaxRequestWait is the longest wait_ms one acquire request asks
// for unless WithMaxRequestWait says otherwise.
const DefaultMaxRequestWait = 30 * time.Second

// DefaultAnswerGrace is how long past the end of the wait it asked for a
// waiting request may take to be answered unless WithAnswerGrace says
// otherwise.
const DefaultAnswerGrace = 2 * time.Second

// DefaultRetries is how many times a request is sent again after every
// server failed it without a decision, unless WithRetries says otherwise.
const DefaultRetries = 2

// DefaultIdleConns is how many idle connections per server the default
// HTTP client keeps for reuse: as many goroutines as share a client can
// each find one.
const DefaultIdleConns = 256

// WithHTTPClient sets the HTTP client. Default: a client of its own with a
// clone of http.DefaultTransport (proxy from the environment, HTTP/2) that
// keeps up to DefaultIdleConns idle connections per server (the default
// transport keeps 2, so a client shared by many goroutines opened a new
// connection for most requests), and no overall timeout, since an acquire may wait on the server; every call
// is bounded by its context instead. It cannot be combined with
// WithTLSConfig: configure TLS on hc's transport.
//
// The client never follows a redirect, hc's CheckRedirect notwithstanding:
// it sends its requests through a copy of hc (its Transport, Jar and
// Timeout) that follows none, and leaves hc as it is. Followed, a 301, 302
// or 303 turns a DELETE or a POST into a GET, and a force-release into an
// inspect that reported success; fenced never redirects, so a redirect is
// an *APIError that names the URL to use instead (package documentation,
// "Errors").
func WithHTTPClient(hc *http.Client) Option {
	return func(c *config) error {
		if hc == nil {
			return errors.New("client: WithHTTPClient(nil)")
		}
		c.hc = hc
		return nil
	}
}

// WithBearerToken sends Authorization: Bearer tok with every request.
// Default: no Authorization header. The token must be at least 16 bytes of
// printable ASCII without spaces: any other is one no server can hold
// (server.MinTokenLen, the token file), and would be refused at every call.
func WithBearerToken(tok string) Option {
	return func(c *config) error {
		if err := checkBearerToken(tok); err != nil {
			return err
		}
		c.token = tok
		return nil
	}
}

// minTokenLen is server.MinTokenLen, which this package does not import.
const minTokenLen = 16

// checkBearerToken refuses a token that no server takes, saying what one
// takes, but never showing the token: it is a secret (docs/design.md,
// defect 208).
func checkBearerToken(tok string) error {
	want := fmt.Sprintf("want at least %d bytes of printable ASCII without spaces, as a server's token file holds them", minTokenLen)
	for i := 0; i < len(tok); i++ {
		if tok[i] < 0x21 || tok[i] > 0x7e {
			return fmt.Errorf("client: bearer token has a byte 0x%02x at %d; %s", tok[i], i, want)
		}
	}
	if len(tok) < minTokenLen {
		return fmt.Errorf("client: bearer token of %d bytes; %s", len(tok), want)
	}
	return nil
}

// WithTLSConfig sets the TLS configuration of the default transport: a
// RootCAs pool for a server certificate signed by a private CA, and
// Certificates for mutual TLS. Default: the system's roots, no client
// certificate. A server certificate it does not trust fails the call at
// once (ErrCertificate), and so does a server that refuses the client's
// certificate, or its lack of one (ErrClientCertificate).
func WithTLSConfig(cfg *tls.Config) Option {
	return func(c *config) error {
		if cfg == nil {
			return errors.New("client: WithTLSConfig(nil)")
		}
		c.tls = cfg.Clone()
		return nil
	}
}

// WithMaxRequestWait sets the longest wait_ms that one acquire request asks
// the server for; a longer wait is split into several requests. Default
// DefaultMaxRequestWait (30s). A server whose --max-wait (60s unless
// configured) is shorter refuses the request (400 on wait_ms, with the
// longest it allows in max_wait_ms): the client then asks for that at once,
// and from then on (see requestWait), rather than fail.
func WithMaxRequestWait(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond {
			return fmt.Errorf("client: max request wait %s: want at least 1ms", d)
		}
		c.maxRequestWait = d
		return nil
	}
}

// WithAnswerGrace sets how long a server has to answer a request that asks
// it to wait (a waiting Acquire's or a campaign's, an Observe long poll)
// once the wait it was asked for is over, and Observe's first request,
// which asks for none. A server that has not answered
// by then is taken for one that stopped answering (a partition, a stopped
// process): the request fails with an error matching ErrNoAnswer, and the
// client moves on as after a lost answer (package documentation, "Servers
// that stop answering"). Default DefaultAnswerGrace (2s). A server answers
// within its wait plus its --backend-timeout (10s unless configured), so a
// grace shorter than that gives up on a server whose backend is slow but
// still answers; the price of a longer one is that a WithWait budget can be
// overrun by up to the grace.
func WithAnswerGrace(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond {
			return fmt.Errorf("client: answer grace %s: want at least 1ms", d)
		}
		c.answerGrace = d
		return nil
	}
}

// WithRetries sets how many times the client sends a request again after
// every server failed it without deciding it: each answered 503 (or
// another 5xx, or a proxy's page: no decision), or could not be reached,
// or (for a request that is safe to repeat) its answer was lost. It pauses before each round: the server's Retry-After, at most 1s,
// else 100ms more each time, both with jitter; the context bounds it all.
// This is what rides out a node draining or a backend failing over behind
// a single URL (a load balancer), as the Python and TypeScript clients'
// retries do. It applies to TryAcquire, Refresh, Release, Inspect, List,
// ForceRelease (after a 503 only with lock.IfToken) and Leader; a waiting
// Acquire or Elect, and Observe, ride out failures within their wait on
// their own. Default DefaultRetries (2); 0 sends each request to each
// server once.
func WithRetries(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("client: retries %d: want 0 or more", n)
		}
		c.retries = n
		return nil
	}
}

// New returns a client of the fenced server at urls, such as
// http://127.0.0.1:7070 or https://fenced.example:7070/prefix, or of
// several servers that share their Redis and etcd, separated by commas:
// http://a:7070,http://b:7070,http://c:7070. The client sends each request
// to the server that answered last, and moves to the next when one cannot
// be reached or answers 503 (see the package documentation for which
// requests it sends again).
func New(urls string, opts ...Option) (*Client, error) {
	cfg := config{maxRequestWait: DefaultMaxRequestWait, answerGrace: DefaultAnswerGrace, retries: DefaultRetries}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	c := &Client{maxRequestWait: cfg.maxRequestWait, answerGrace: cfg.answerGrace, retries: cfg.retries}
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		shown := redact.URL(raw) // an error must not print a password
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("client: URL %q: want http://host:port or https://host:port, several separated by commas", shown)
		}
		if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return nil, fmt.Errorf("client: URL %q: want no user, query or fragment", shown)
		}
		// url.Parse takes any digits; a bad port would fail only at the
		// first request, naming no URL.
		if p := u.Port(); p != "" {
			if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
				return nil, fmt.Errorf("client: URL %q: port %q: want a number from 1 to 65535", shown, p)
			}
		}
		c.urls = append(c.urls, strings.TrimRight(u.String(), "/"))
	}
	c.leases, _ = lock.NewLeaseSet(keeper{c}) // cannot fail: the keeper is not nil
	if cfg.token != "" {
		c.auth = "Bearer " + cfg.token
	}
	if c.hc = cfg.hc; c.hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 0, DefaultIdleConns // 0: bounded per server only
		if cfg.tls != nil {
			tr.TLSClientConfig = cfg.tls
		}
		c.hc, c.ownHC = &http.Client{Transport: tr, CheckRedirect: noRedirects}, true
	} else if cfg.tls != nil {
		return nil, errors.New("client: WithTLSConfig and WithHTTPClient together: set the TLS configuration on the HTTP client's transport")
	} else {
		hc := *cfg.hc // the caller's is left as it is (WithHTTPClient)
		hc.CheckRedirect = noRedirects
		c.hc = &hc
	}
	return c, nil
}

// noRedirects makes an http.Client return a redirect as its answer, which
// send turns into an error (redirected): followed, 301 to 303 turn DELETE
// and POST into GET, and a force-release into an inspect that reported
// success (docs/design.md, defect 225).
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// URLs are the servers' base URLs, in the order given to New.
func (c *Client) URLs() []string { return append([]string(nil), c.urls...) }

// TryAcquire makes one attempt: it returns an error matching
// lock.ErrNotAcquired at once when the lock is held. Options as for
// lock.Client.TryAcquire: WithKeepAlive or WithDetached, WithOwner (a label
// GET and list show), WithHolder (reentrant: the holder that holds the lock
// gets its lease again, and Lease.Count says how many releases it takes).
// The holder identity is a credential, as the lease id is: whoever sends it
// gets the lease id, so the server never shows it; choose an unguessable
// one (random per process) and never log it.
//
// When the context ends (or Close ends the call) while its request is in
// flight, the server may have granted it, the answer on its way: the call
// then sends one more attempt with its waiter, after it returned, and
// releases the grant that attempt finds (or the free lock it takes), as
// Acquire gives its place up; if the server cannot be reached within a
// second, such a grant holds the lock until its TTL.
func (c *Client) TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...lock.Option) (*Lease, error) {
	o, err := lock.ResolveOptions(true, opts...)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, name, ttl, o, false)
}

// Acquire blocks until it holds the lease of name, the context ends (an
// error matching ctx.Err()), or the wait budget of lock.WithWait runs out
// (an error matching lock.ErrNotAcquired). A server that does not answer a
// request within the wait it asked for and WithAnswerGrace ends it too
// (an error matching ErrNoAnswer; package documentation, "Servers that
// stop answering"), budget or not. The server does the waiting:
// each request asks it to wait up to WithMaxRequestWait. Options as for
// lock.Client.Acquire, except lock.WithRetry: the server is notified of
// releases, and the client has no fallback to tune. Waiting is fair: a
// request that ends with the wait budget left is sent again, with the
// same waiter, and keeps its place in the server's queue. When the budget
// runs out the error is a *lock.WaitError with the place the last request
// had.
//
// When the context ends (or Close ends the call) while a request is in
// flight, the call gives its place in the queue up with one more request,
// and releases a grant that request finds (docs/design.md, defect 134); if
// the server cannot be reached within a second, the place goes after 3 s
// and a grant it made after its TTL. An unfair Acquire does the same with
// one attempt under its waiter, as TryAcquire does.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, opts ...lock.Option) (*Lease, error) {
	o, err := lock.ResolveOptions(false, opts...)
	if err != nil {
		return nil, err
	}
	if o.Retry != nil {
		return nil, fmt.Errorf("%w: WithRetry does not apply to a fenced server's client: the server waits and is notified of releases; bound the wait with WithWait", lock.ErrInvalidOption)
	}
	return c.acquire(ctx, name, ttl, o, false)
}

// acquire takes a lease, or campaigns in an election (o.Owner is then the
// leader's value).
func (c *Client) acquire(ctx context.Context, name string, ttl time.Duration, o lock.AcquireOptions, campaign bool) (got *Lease, _ error) {
	if err := lock.ValidateName(name); err != nil {
		return nil, err
	}
	if err := lock.ValidateTTL(ttl); err != nil {
		return nil, err
	}
	verb := "acquire"
	if campaign {
		verb = "campaign"
	}
	ctx, end, err := c.calls.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: %s %q: %w", verb, name, err)
	}
	defer func() {
		if end != nil { // nil once a give-up took the call over
			end()
		}
	}()
	began := time.Now()
	var budgetEnd time.Time
	if o.Wait > 0 {
		budgetEnd = began.Add(o.Wait)
	}
	// One id for all the requests of an acquisition (API field waiter):
	// a request sent again after a lost answer gets the grant the first
	// one made, rather than finding the lock held by a lease nobody knows
	// until its TTL; and a fair wait longer than one request keeps its
	// place in the queue instead of queueing anew with each. So every
	// acquisition may be sent again (package documentation, "Several
	// servers"): a TryAcquire as a short request, round the servers up to
	// WithRetries times; a wait within its budget, by the loop below.
	waiter := o.Waiter
	if waiter == "" {
		if waiter, err = lock.NewWaiterID(); err != nil {
			return nil, fmt.Errorf("client: %s %q: %w", verb, name, err)
		}
	}
	mode := resendAlways
	if o.Try {
		mode = resendShared
	}
	// until is when the wait ends: its budget or the context's deadline,
	// whichever comes first; zero when it has neither.
	until := budgetEnd
	if dl, ok := ctx.Deadline(); ok && (until.IsZero() || dl.Before(until)) {
		until = dl
	}
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	backoff := minBackoff
	position := 0 // in the queue, as the last 409 that had one said
	// budgetOver is the error once the wait budget is over, as lock.Client
	// says it: how long, and the place in the queue the last request that
	// queued had when the server gave up (a last request of under a
	// millisecond makes one attempt); nil before.
	budgetOver := func() error {
		if budgetEnd.IsZero() || time.Now().Before(budgetEnd) {
			return nil
		}
		return fmt.Errorf("client: %s %q: %w", verb, name, &lock.WaitError{Name: name, Waited: time.Since(began), Position: position})
	}
	path := lockPath(name, "acquire")
	if campaign {
		path = electionPath(name, "campaign")
	}
	// The wait may end after a request that was not final: one answered
	// late, or held a while on its way, or early (the server's own
	// deadline). That request's place is kept for a next one, and a kept
	// place holds a free lock from those behind it for the waiter TTL (3 s).
	// So while placed, the wait ends with one more request, final and of
	// 1 ms, which gives the place up (docs/design.md, defect 128). A place
	// of the caller's own (WithWaiter without WithFinal) is the caller's to
	// keep.
	ownWaiter := o.Waiter == "" || o.Final // no later call of the caller's comes with it
	givesUp := !o.Unfair && ownWaiter
	placed := false // the last request sent kept its place if it ended held
	// A wait its caller cuts short (ctx, Close) may leave a place at the
	// server too: the request in flight keeps it when it ends, final or
	// not, if it had not yet found the lock held. Kept, it would stand 3 s
	// before everyone behind it (defect 134); so the call gives it up, on
	// a goroutine of its own, which stays a call of the client until it
	// ends (Close waits for it): the caller, whose deadline may be what
	// ended, does not wait for it (as defect 126's stores do not).
	//
	// Any request the context cuts short may also have been granted, its
	// answer on its way: a TryAcquire's, an unfair wait's, a wait's first
	// request of under a millisecond (one attempt). Unfound, that grant
	// held the lock, known to nobody, for its TTL; so such a call gives up
	// too, with one attempt (wait_ms 0) under its waiter, which finds the
	// grant, or takes the lock if free, and releases either
	// (docs/design.md, "A lost answer"). A waiter of the caller's own
	// (WithWaiter without WithFinal) finds its grant with its next call.
	//
	// So may the last request of a call that ends with no answer of
	// fenced's to it (lost, a 503, a proxy's page: unanswered) when no
	// request is sent again, its retries spent or its wait over: that call
	// gives up the same way (defect 240).
	queued := false    // a fair waiting request was sent
	cut := false       // the context ended while a request was in flight
	unsettled := false // the last request sent got no answer of fenced's
	defer func() {
		if got != nil || !ownWaiter && !queued {
			return
		}
		if ctx.Err() == nil && !unsettled || ctx.Err() != nil && !(queued || cut) {
			return
		}
		if c.givingUp.Add(1) > maxGivingUp {
			c.givingUp.Add(-1) // too many: the place goes after 3 s
			return
		}
		done := end
		end = nil
		go func() {
			defer done()
			defer c.givingUp.Add(-1)
			c.giveUp(ctx, name, path, ttl, waiter, o, campaign, queued)
		}()
	}()
	for {
		// The body is built for each server the request goes to, so that
		// a request passed on to the next server asks only for the wait
		// that is left, and none is sent once it is over. A waiting
		// request must be answered within its wait and the answer grace:
		// a server that stops answering must not hold the call past its
		// budget, or for ever without one. A TryAcquire is bounded by ctx
		// alone, as it asks the server for no wait of the client's choosing.
		var (
			start time.Time     // when the last request built was sent; zero before the first
			asked time.Duration // and the wait it asked for
		)
		body := rebuilt(func() (attempt, bool) {
			var wait, within time.Duration
			final := false // this request's wait is all the call has left
			if !o.Try {
				wait = c.requestWait()
				if !until.IsZero() {
					left := time.Until(until)
					wait, final = min(wait, left), left <= wait
				}
				wait = max(wait.Truncate(time.Millisecond), 0)
				switch {
				case wait == 0 && placed:
					wait, final = time.Millisecond, true // the wait ended: give the place up
				case wait == 0 && !start.IsZero():
					return attempt{}, false // the wait ended: no request to the next server
				}
				within = wait + c.answerGrace
			}
			start, asked = time.Now(), wait
			ttlMs, waitMs := ttl.Milliseconds(), wait.Milliseconds()
			// A final request's place goes when it ends held, so that it
			// does not keep a free lock from those behind it. Only a fair
			// wait has one (one attempt, wait_ms 0, has none), and a waiter
			// of the caller's own (WithWaiter) may come back with another
			// call, unless it said this is the last (WithFinal).
			final = final && waitMs > 0 && givesUp
			placed = givesUp && waitMs > 0 && !final
			queued = queued || (givesUp && waitMs > 0)
			if campaign {
				return attempt{api.CampaignRequest{TTLMs: &ttlMs, WaitMs: &waitMs, Value: o.Owner, Waiter: waiter, Final: final}, within}, true
			}
			return attempt{api.AcquireRequest{TTLMs: &ttlMs, WaitMs: &waitMs, Owner: o.Owner, Holder: o.Holder, Unfair: o.Unfair && waitMs > 0, Waiter: waiter, Final: final}, within}, true
		})
		var a api.Lease
		err := c.do(ctx, http.MethodPost, path, body, &a, mode)
		cut = ctx.Err() != nil
		unsettled = err != nil && unanswered(err)
		if err == nil {
			l, err := c.adopt(ctx, name, start, a, o)
			if err == nil || o.Try || !errors.Is(err, lock.ErrNotAcquired) || (!until.IsZero() && !time.Now().Before(until)) {
				// At the wait's end this grant's error (ErrTTLTooShort)
				// is why it failed: no next request would say so.
				return l, err
			}
			continue // granted with no validity left: released, try again
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("client: %s %q: %w", verb, name, c.ctxErr(ctx))
		}
		if c.refusedWait(err, asked) {
			continue // the same wait, in requests the server allows
		}
		tooShort := errors.Is(err, lock.ErrTTLTooShort)
		if !errors.Is(err, lock.ErrNotAcquired) || tooShort {
			// A 503 about ttl_ms matches ErrNotAcquired but is no held
			// lock: asked again, the next grant may come back in time.
			//
			// A bounded wait rides out a server that is briefly away (a
			// restart, a lost answer, a 503), as the server rides out its
			// backends; the waiter id makes a grant whose answer was lost
			// come back with the next request (package documentation,
			// "Several servers").
			if o.Try || until.IsZero() || !(tooShort || unanswered(err)) || !time.Now().Before(until) {
				return nil, fmt.Errorf("client: %s %q: %w", verb, name, err)
			}
			pause := backoff
			if tooShort && asked > 0 && time.Since(start) >= asked/2 {
				// The server tried again within the wait it was asked for:
				// the next request goes as after a held lock's answer.
				pause = max(minBackoff-time.Since(start), 0)
			}
			if !clock.Sleep(ctx, min(pause, time.Until(until))) {
				return nil, fmt.Errorf("client: %s %q: %w", verb, name, c.ctxErr(ctx))
			}
			if !time.Now().Before(until) {
				// The wait ended in the pause: no request once it is over
				// (a next one would make one attempt, wait_ms 0, and its
				// "held" hide why the wait failed).
				return nil, fmt.Errorf("client: %s %q: %w", verb, name, err)
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		if o.Try {
			return nil, fmt.Errorf("client: %s %q: %w", verb, name, err)
		}
		var ae *APIError
		if errors.As(err, &ae) && ae.Position > 0 {
			position = ae.Position
		}
		if err := budgetOver(); err != nil {
			if placed {
				continue // one more request, to give the place up
			}
			return nil, err
		}
		// A server that answers held well before the wait it was asked for
		// (a shorter --max-wait, a context deadline) must not be polled in
		// a busy loop: it gets a back-off that doubles. One that answers at
		// the end of it is asked again at once, but no sooner than
		// minBackoff after the last request began: requests of a few
		// milliseconds (WithMaxRequestWait, a server's --max-wait of 1ms)
		// made a waiter send hundreds a second (docs/design.md, defect 143).
		early := asked == 0 || time.Since(start) < asked/2
		pause := backoff
		if !early {
			backoff = minBackoff
			if pause = minBackoff - time.Since(start); pause <= 0 {
				continue
			}
		}
		if !budgetEnd.IsZero() {
			pause = min(pause, time.Until(budgetEnd))
		}
		if !clock.Sleep(ctx, pause) {
			return nil, fmt.Errorf("client: %s %q: %w", verb, name, c.ctxErr(ctx))
		}
		if err := budgetOver(); err != nil { // it ended in the back-off: no request to wait once it is over
			if placed {
				continue // but one to give the place up
			}
			return nil, err
		}
		if early {
			backoff = min(2*backoff, maxBackoff)
		}
	}
}

// maxGivingUp bounds the give-ups running at once: when a server is away
// every wait cut short asks for one, and past this many their places are
// left to expire (3 s).
const maxGivingUp = 64

// giveUp ends an acquisition its caller cut short: one request with its
// waiter, within a second of its own. For a fair wait that may have a
// place (placed), the request is final and of 1 ms: the server then gives
// the place up as soon as the request cut short ends there too
// (lock.WithFinal). Otherwise it is one attempt (wait_ms 0, which has no
// place and no final), as a TryAcquire's. Its answer may be a grant: the
// lock came free, or the request cut short was granted and its answer is
// found again by the waiter (which would otherwise hold the lock, known to
// nobody, until its TTL); either is not the caller's, and is released
// (docs/design.md, defect 134 and "A lost answer"). A free lock it takes
// is held only until that release, its answer's way back.
func (c *Client) giveUp(ctx context.Context, name, path string, ttl time.Duration, waiter string, o lock.AcquireOptions, campaign, placed bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	ttlMs, waitMs := ttl.Milliseconds(), int64(0)
	if placed {
		waitMs = 1
	}
	var body any = api.AcquireRequest{TTLMs: &ttlMs, WaitMs: &waitMs, Owner: o.Owner, Holder: o.Holder, Waiter: waiter, Final: placed}
	if campaign {
		body = api.CampaignRequest{TTLMs: &ttlMs, WaitMs: &waitMs, Value: o.Owner, Waiter: waiter, Final: placed}
	}
	var a api.Lease
	if c.do(ctx, http.MethodPost, path, body, &a, resendShared) == nil && a.LeaseID != "" {
		_ = keeper{c}.Release(ctx, name, a.LeaseID, "")
	}
}

// ctxErr is why ctx ended: lock.ErrClosed if Close ended it, else ctx.Err().
func (c *Client) ctxErr(ctx context.Context) error {
	if err := c.calls.Ended(ctx); err != nil {
		return err
	}
	return ctx.Err()
}

// requestWait is the longest wait_ms one request asks for:
// WithMaxRequestWait, or less once a server refused that (refusedWait).
func (c *Client) requestWait() time.Duration {
	if w := time.Duration(c.allowedWait.Load()); w > 0 && w < c.maxRequestWait {
		return w
	}
	return c.maxRequestWait
}

// refusedWait reports whether err is a server's refusal of the wait_ms
// asked for (a 400 on wait_ms: its --max-wait is shorter than
// WithMaxRequestWait), and if so lowers requestWait to the longest the
// server allows (max_wait_ms), or, from a server that does not say, to half
// of asked, down to 1ms: the caller asks again at once. With several
// servers the client keeps the least any allowed.
func (c *Client) refusedWait(err error, asked time.Duration) bool {
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument || ae.Field != api.FieldWaitMs || asked <= time.Millisecond {
		return false
	}
	lower := max(asked/2, time.Millisecond)
	if ae.MaxWait > 0 && ae.MaxWait < asked {
		lower = ae.MaxWait
	}
	for {
		cur := c.allowedWait.Load()
		if (cur > 0 && cur <= int64(lower)) || c.allowedWait.CompareAndSwap(cur, int64(lower)) {
			return true
		}
	}
}

// unanswered reports whether a request failed without the server's
// decision: it could not be sent, its answer was lost, or the answer was
// not a decision (undecidedAnswer). A certificate the client does not
// trust (ErrCertificate), or a server that refuses the client's
// (ErrClientCertificate), is no such failure: asked again, every server
// fails the handshake again, until the client is given the CA or its
// certificate.
func unanswered(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return undecidedAnswer(ae)
	}
	return !certificateFailure(err)
}

// undecidedAnswer reports whether an error answer may not be fenced's decision:
// a 503 (a backend, or the server itself, briefly unavailable; fenced
// answers so too when its backend applied the request and then failed),
// another 5xx, or an answer without an API error code (a proxy's 502 or
// 504 page). Each may come after fenced acted on the request, as a lost
// answer may, and is handled as one: a grant made for a waiter is found
// again only by asking again (docs/design.md, defect 119).
//
// One 503 is fenced's decision: unavailable about ttl_ms (an acquire's
// grant came back with no validity left and was released; nobody holds
// the lock). Sent again at once, it made a TryAcquire take 1.5 s of resends
// (docs/design.md, defect 184); a wait asks again itself.
//
// A redirect is no answer of fenced either, but one of something in front
// of it, which sent the request nowhere: nothing was applied, and sent
// again the request would be redirected again, so it is a refusal, as a
// 4xx is.
func undecidedAnswer(ae *APIError) bool {
	if ae.Code == api.CodeUnavailable && ae.Field == api.FieldTTLMs || isRedirect(ae.Status) {
		return false
	}
	return ae.Status >= 500 || ae.Code == ""
}

// adopt turns an acquire answer into a lock.Lease. A lease granted with no
// validity left is released and is an error matching lock.ErrNotAcquired.
func (c *Client) adopt(ctx context.Context, name string, start time.Time, a api.Lease, o lock.AcquireOptions) (*Lease, error) {
	if a.LeaseID == "" || a.Token == 0 || a.TTLMs <= 0 {
		return nil, fmt.Errorf("client: acquire %q: the server's answer lacks lease_id, token or ttl_ms", name)
	}
	var opts []lock.Option
	if o.KeepAlive {
		opts = append(opts, lock.WithKeepAlive())
	}
	if o.Detached {
		opts = append(opts, lock.WithDetached())
	}
	// A reentry is reused whatever the server says: one older than
	// "reused" says nothing (docs/design.md, defect 216).
	g := lock.Grant{Token: a.Token, TTL: time.Duration(a.TTLMs) * time.Millisecond, LeaseID: a.LeaseID, Count: a.Count,
		Reused: a.Reused || a.Count > 1}
	// The validity runs from the attempt that granted the lease, which the
	// server began waited_ms after it had the request, so never before
	// start + waited_ms.
	start = start.Add(time.Duration(max(a.WaitedMs, 0)) * time.Millisecond)
	l, err := c.leases.Adopt(ctx, name, a.LeaseID, g, start, opts...)
	if o.Detached && errors.Is(err, lock.ErrClosed) {
		// This client's own acquisition, which Close overtook: it takes
		// nothing, as Close says. A lease that is not detached the set
		// released already (docs/design.md, defect 217).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = keeper{c}.Release(rctx, name, a.LeaseID, "")
	}
	return l, err
}

// Inspect reports who holds name. The server never tells the lease id or
// the holder identity, so State.LeaseID and State.Holder are empty;
// State.Remaining is the TTL the lease has left.
func (c *Client) Inspect(ctx context.Context, name string) (lock.State, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.State{}, err
	}
	var a api.LockState
	if err := c.do(ctx, http.MethodGet, lockPath(name, ""), nil, &a, resendShared); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return lock.State{}, fmt.Errorf("client: inspect %q: %w", name, err)
	}
	return a.State(), nil
}

// List returns one page of the locks held now whose names start with
// prefix: at most limit (1 to lock.MaxListLimit), from cursor ("" for the
// first page; then the previous page's Next), as lock.Client.List does.
// A token limited to name prefixes lists under one of them only. As with
// Inspect, each State's LeaseID and Holder are empty.
func (c *Client) List(ctx context.Context, prefix string, limit int, cursor string) (lock.ListPage, error) {
	if err := lock.ValidateNamePrefix(prefix); err != nil {
		return lock.ListPage{}, err
	}
	if limit < 1 || limit > lock.MaxListLimit {
		return lock.ListPage{}, fmt.Errorf("%w: limit %d: want 1 to %d", lock.ErrInvalidOption, limit, lock.MaxListLimit)
	}
	q := url.Values{"prefix": {prefix}, "limit": {strconv.Itoa(limit)}}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var a api.LockList
	if err := c.do(ctx, http.MethodGet, "/v1/locks?"+q.Encode(), nil, &a, resendShared); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return lock.ListPage{}, fmt.Errorf("client: list %q: %w", prefix, err)
	}
	page := lock.ListPage{Next: a.NextCursor}
	for _, st := range a.Locks {
		page.Locks = append(page.Locks, st.State())
	}
	return page, nil
}

// ForceRelease deletes the lease of name whoever holds it (the server's
// force-release permission), as lock.Client.ForceRelease does, and returns
// the state the lock had: Held false if nobody held it (LeaseID and
// Holder empty, as with Inspect).
//
// Without options it is sent again only when it cannot have reached a
// server (see the package documentation, "Several servers"): after a lost
// answer or a 503 the error says the lock may have been released, since a
// second request would delete whatever holds the lock by then, most often
// the waiter the first one woke.
//
// With lock.IfToken(t) only the grant with token t is released, and a lock
// held by another is a *lock.HeldByOtherError (lock.ErrHeldByOther); such
// a force-release is safe to send again, and is, after a 503 or a lost
// answer, as a release is. A request sent again that finds the lock free
// (Held false) or held by another grant (the error) cannot tell whether
// the request before it released grant t or the grant was gone already;
// either way t no longer holds the lock, which is what was asked.
func (c *Client) ForceRelease(ctx context.Context, name string, opts ...lock.ForceOption) (lock.State, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.State{}, err
	}
	o, err := lock.ResolveForceOptions(opts...)
	if err != nil {
		return lock.State{}, err
	}
	path, mode := lockPath(name, ""), resendUnwritten
	if o.Token != 0 {
		// The next holder has another token: a request sent again finds
		// the lock free or held by it, and deletes nothing.
		path, mode = path+"?"+url.Values{api.FieldToken: {o.Token.String()}}.Encode(), resendShared
	}
	var a api.LockState
	err = c.do(ctx, http.MethodDelete, path, nil, &a, mode)
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == api.CodeNotFound && ae.Field == "" {
		return lock.State{Name: name}, nil
	}
	if o.Token != 0 && errors.As(err, &ae) && ae.Code == api.CodeHeld {
		return lock.State{}, fmt.Errorf("client: force-release %q: %w", name, &lock.HeldByOtherError{Name: name, Token: ae.Token, Want: o.Token})
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return lock.State{}, fmt.Errorf("client: force-release %q: %w", name, err)
	}
	return a.State(), nil
}

// Close releases every lease the client still holds and waits for their
// keep-alive refreshes in flight. An acquisition in progress (Acquire,
// TryAcquire, Campaign), waiting for a held lock or for a server, returns
// lock.ErrClosed at once (its request is cut off; the server keeps its
// place in the queue no longer than a waiter's that went away), and Close
// waits for it to return, or for ctx to end; so does an Observe, whose
// channel closes. Later acquisitions and Observes return lock.ErrClosed.
// Close is idempotent.
func (c *Client) Close(ctx context.Context) error {
	c.calls.Close(lock.ErrClosed)
	err := c.leases.Close(ctx)
	if werr := c.calls.Wait(ctx); werr != nil {
		err = errors.Join(err, fmt.Errorf("client: close: acquisitions still returning: %w", werr))
	}
	if c.ownHC {
		c.hc.CloseIdleConnections()
	}
	return err
}

func lockPath(name, action string) string { return apiPath("/v1/locks/", name, action) }

func electionPath(name, action string) string { return apiPath("/v1/elections/", name, action) }

// apiPath is the path of a lock or an election, and an action on it.
func apiPath(under, name, action string) string {
	p := under + url.PathEscape(name)
	if action != "" {
		p += "/" + action
	}
	return p
}

// maxAnswer bounds how much of an answer the client reads.
const maxAnswer = 1 << 20

// errMaybeForced marks the error of a force-release that may have reached
// its server but lost its answer: sent again, it would delete whatever
// holds the lock by then, most often the waiter the first one woke.
var errMaybeForced = errors.New("the request was sent and its answer lost, so it may have released the lock; it is not sent again, since a second one would release the next holder's lease: inspect the lock to see who holds it now, and force-release with the holder's token (lock.IfToken), which is safe to send again")

// errMaybeForcedUndecided is errMaybeForced for an answer that is not a
// decision (undecidedAnswer): the server may have failed after its backend
// applied the force-release (a backend call that timed out after it was
// done), or a proxy answered for it after it did.
var errMaybeForcedUndecided = errors.New("the answer was a 503 or not fenced's own (another 5xx, a proxy's page), which can come after the request was applied, so it may have released the lock; it is not sent again, since a second one would release the next holder's lease: inspect the lock to see who holds it now, and force-release with the holder's token (lock.IfToken), which is safe to send again")

// resend says when a request may be sent to the next server.
type resend int

const (
	// resendAlways: after a 503, any answer that is no decision
	// (undecidedAnswer) or any failure to get an answer. For requests
	// that are safe to repeat.
	resendAlways resend = iota
	// resendUnwritten: only when the request was not written to the
	// connection; not after a 503 or another answer that is no decision,
	// which may come after the request was applied. For an unconditional force-release,
	// which sent twice deletes the next holder too.
	resendUnwritten
	// resendShared: as resendAlways, and each server but the last has
	// only half of the time left before ctx's deadline, so that one that
	// stops answering leaves the next the time to answer, while the
	// server tried first (the one that answered last, most often healthy)
	// has the most time when it is only slow. For short requests:
	// refresh, release, inspect, list, a force-release with a token; not
	// for one that asks the server to wait, which a share would cut short.
	resendShared
)

// attempt is a request to one server: its body (nil for none), and how
// long the server has to answer it from when it is sent (0: as long as
// ctx allows).
type attempt struct {
	body   any
	within time.Duration
}

// rebuilt is a request built anew for each server it is sent to: a
// waiting acquisition's asks only for the wait that is left. It returns
// false when there is nothing left to ask for.
type rebuilt func() (attempt, bool)

// do sends one request and decodes a 200 answer into out (if not nil),
// moving through the servers as mode allows, and goes round them again,
// up to c.retries times, while every one failed without deciding it (see
// WithRetries). A waiting request (resendAlways) goes round once: its
// caller rides out failures within its wait. The error is the last
// round's.
func (c *Client) do(ctx context.Context, method, path string, in, out any, mode resend) error {
	return c.doNoting(ctx, method, path, in, out, mode, nil)
}

// doNoting is do, and sets *unanswered (if not nil) when an attempt that
// was sent got no answer or one that is no decision (undecidedAnswer), and
// so may have been applied, before
// the attempt that decided it.
func (c *Client) doNoting(ctx context.Context, method, path string, in, out any, mode resend, unanswered *bool) error {
	retries := c.retries
	if mode == resendAlways {
		retries = 0
	}
	var sent bool // a round's request may have reached a server
	for tries := 1; ; tries++ {
		sentBefore := sent
		undecided, err := c.round(ctx, method, path, in, out, mode, &sent)
		if unanswered != nil && sent {
			*unanswered = true
		}
		if err == nil || !undecided || tries > retries {
			if sentBefore {
				// A certificate refused now says nothing of the request an
				// earlier round sent: it may have been applied, so the
				// error is no lock.ErrCannotSend (docs/design.md, defect
				// 258).
				sentAgain(err)
			}
			if err != nil && tries > 1 {
				err = fmt.Errorf("%w (tried %d times)", err, tries)
			}
			return err
		}
		if !clock.Sleep(ctx, retryPause(err, tries)) {
			return ctx.Err()
		}
	}
}

// retryPause is how long to wait before the next round after tries
// rounds that ended in err: the Retry-After of a 503, else 100ms a round
// tried, at most 1s, and from half of that to all of it, so that the
// clients a failure hit at once do not come back at once.
func retryPause(err error, tries int) time.Duration {
	d := time.Duration(tries) * 100 * time.Millisecond
	var ae *APIError
	if errors.As(err, &ae) && ae.RetryAfter > 0 {
		d = ae.RetryAfter
	}
	d = min(d, time.Second)
	return d/2 + rand.N(d/2+1)
}

// round sends one request to each server in turn, from the one that
// answered last, until one answers, and decodes a 200 answer into out (if
// not nil); it moves on only as mode allows. in is the body: nil, a value
// to encode, or a rebuilt. Any other status is an *APIError; a server that
// does not answer within the time its attempt has (its within, its share)
// is an error matching ErrNoAnswer. undecided says that every server
// failed without a decision (as mode counts it), so that the request may
// be sent again. With several servers, the error after every server
// failed joins a *ServerError for each; a rebuilt that returns false ends
// the round with the last server's error.
func (c *Client) round(ctx context.Context, method, path string, in, out any, mode resend, unanswered *bool) (undecided bool, err error) {
	n := len(c.urls)
	first := int(c.cur.Load())
	var (
		errs []error
		last error
		// untrusted: every server failed on its certificate, which the
		// client does not trust (ErrCertificate), or refused the
		// client's (ErrClientCertificate). Each handshake fails alike
		// until the client is given the CA or its certificate, so that
		// is no failure to send again, or to wait out; one server's is
		// passed over, as one that cannot be reached is: nothing
		// reached it.
		untrusted = true
		certs     []*certificateError
	)
	for i := range n {
		at := attempt{body: in}
		if b, ok := in.(rebuilt); ok {
			var more bool
			if at, more = b(); !more {
				return false, last
			}
		}
		var body []byte
		if at.body != nil {
			b, err := json.Marshal(at.body)
			if err != nil {
				return false, fmt.Errorf("client: encode request: %w", err)
			}
			body = b
		}
		k := (first + i) % n
		within := at.within
		if dl, ok := ctx.Deadline(); ok && mode == resendShared && i < n-1 {
			if share := time.Until(dl) / 2; within == 0 || share < within {
				within = share
			}
		}
		actx, cancel := ctx, context.CancelFunc(func() {})
		if within > 0 {
			actx, cancel = context.WithTimeout(ctx, within)
		}
		sent, err := c.send(actx, c.urls[k], method, path, body, out)
		timedOut := actx.Err() != nil
		cancel()
		if err == nil {
			c.cur.Store(int32(k))
			return false, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		var ae *APIError
		if timedOut && !errors.As(err, &ae) {
			// Not the caller's deadline, which has not passed: this
			// server's time is up. Said as such, so that it does not
			// look like the caller's own context.DeadlineExceeded.
			err = fmt.Errorf("%w: %s did not answer %s %s within %s", ErrNoAnswer, c.urls[k], method, path, within.Round(time.Millisecond))
		}
		next := false
		if errors.As(err, &ae) {
			next = undecidedAnswer(ae) && mode != resendUnwritten
		} else {
			next = !sent || mode != resendUnwritten
		}
		if unanswered != nil && sent && (ae == nil || undecidedAnswer(ae)) {
			*unanswered = true
		}
		if !next {
			switch {
			case sent && ae == nil:
				err = fmt.Errorf("%w: %w", errMaybeForced, err)
			case ae != nil && undecidedAnswer(ae):
				err = fmt.Errorf("%w: %w", errMaybeForcedUndecided, err)
			}
			return false, err
		}
		ce, _ := err.(*certificateError)
		if n == 1 {
			return ce == nil, err
		}
		if ce != nil {
			certs = append(certs, ce)
		} else {
			untrusted = false
		}
		last = &ServerError{URL: c.urls[k], Err: err}
		errs = append(errs, last)
		c.cur.CompareAndSwap(int32(k), int32((k+1)%n)) // prefer the next from now on
	}
	if !untrusted {
		// Another server failed otherwise, and may answer when asked
		// again: the round is no certificate failure.
		for _, ce := range certs {
			ce.passed = true
		}
	}
	return !untrusted, fmt.Errorf("client: none of %d fenced servers answered %s %s: %w", n, method, path, errors.Join(errs...))
}

// send sends one request to the server at base. sent says whether the
// request was written to a connection, and so may have reached it.
func (c *Client) send(ctx context.Context, base, method, path string, body []byte, out any) (sent bool, err error) {
	var wrote atomic.Bool
	tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) },
	})
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(tctx, method, base+path, rd)
	if err != nil {
		return false, fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return wrote.Load(), ctx.Err()
		}
		if ce := untrustedCertificate(err, method, base, path); ce != nil {
			// The handshake failed: nothing was read. Under TLS 1.3 the
			// server refuses the client's certificate after the client's
			// side of the handshake is over, and the request may have
			// been written by then, but the server read none of it.
			return false, ce
		}
		return wrote.Load(), fmt.Errorf("client: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		if ctx.Err() != nil {
			return true, ctx.Err()
		}
		return true, fmt.Errorf("client: reading the answer of %s %s: %w", method, path, err)
	}
	if isRedirect(resp.StatusCode) {
		return true, redirected(resp, base, path)
	}
	if resp.StatusCode != http.StatusOK {
		ae := apiError(resp.StatusCode, b)
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			ae.RetryAfter = time.Duration(secs) * time.Second // an HTTP date is ignored: the usual pause
		}
		return true, ae
	}
	if out == nil {
		return true, nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return true, fmt.Errorf("client: the answer of %s %s is not the JSON expected: %w", method, path, err)
	}
	return true, nil
}

// isRedirect reports whether status is a redirect (3xx): never fenced's
// answer, which is a decision (200) or an error (4xx, 5xx).
func isRedirect(status int) bool { return status >= 300 && status < 400 }

// redirected is the error of a redirect answered to the request of path
// sent to base: something in front of fenced (an ingress that sends
// http:// to https://, a load balancer moved) sent the client elsewhere.
// The request reached no fenced server, so nothing was applied, and
// sending it again would be redirected again: it is refused as a 4xx is
// (undecidedAnswer). It says where to point the client: the Location less
// the request's path, when it ends with it.
func redirected(resp *http.Response, base, path string) *APIError {
	ae := &APIError{Status: resp.StatusCode}
	loc, err := resp.Location()
	if err != nil {
		ae.Message = fmt.Sprintf("%s%s redirected without a Location; fenced never redirects, so something in front of it answered: point the client at fenced's own URL", redact.URL(base), path)
		return ae
	}
	to := redact.URL(loc.String())
	point := "the URL fenced answers on"
	if final, ok := strings.CutSuffix(to, path); ok && final != "" {
		point = final
	}
	ae.Message = fmt.Sprintf("%s%s redirected to %s; fenced never redirects, so something in front of it answered, and the client follows no redirect (a 301 to 303 would turn the request into a GET): point the client at %s", redact.URL(base), path, to, point)
	return ae
}

// apiError is the *APIError of an answer of status other than 200 or a
// redirect, with its body. Only a 4xx or 5xx is fenced's error: fenced's
// one success is 200, so another 2xx is something in front of it
// answering in its place, maybe without passing the request on. Its code,
// if its body has one, is not taken: it is an answer without one, no
// decision of fenced's (undecidedAnswer), sent again where that is safe.
// Taken, a 202 with "lost" said a release failed that a retry would have
// made, and one with "not_found" that a lock was free while its lease held
// it (docs/design.md, defect 243; the Python and TypeScript clients' 237).
func apiError(status int, body []byte) *APIError {
	var e api.ErrorBody
	if status < 400 {
		return &APIError{Status: status, Message: excerpt(status, body)}
	}
	if err := json.Unmarshal(body, &e); err == nil && e.Error.Code != "" {
		ae := &APIError{Status: status, Code: e.Error.Code, Field: e.Error.Field, Message: e.Error.Message}
		if e.Error.WaitedMs != nil {
			ae.Waited = time.Duration(*e.Error.WaitedMs) * time.Millisecond
		}
		if e.Error.Position != nil {
			ae.Position = *e.Error.Position
		}
		if e.Error.MaxWaitMs != nil {
			ae.MaxWait = time.Duration(*e.Error.MaxWaitMs) * time.Millisecond
		}
		if e.Error.Token != nil {
			ae.Token = *e.Error.Token
		}
		ae.LostForCertain = e.Error.MaybeReleased != nil && !*e.Error.MaybeReleased
		return ae
	}
	return &APIError{Status: status, Message: excerpt(status, body)}
}

// excerpt is the message of an answer that is not an API error: the start
// of its body, or its status's text if it has none.
func excerpt(status int, body []byte) string {
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	return msg
}
