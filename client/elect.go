package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/lock"
)

var _ lock.Elector = (*Client)(nil)

// Elect campaigns in election name through the server and returns when the
// caller leads, as lock.Client.Elect does: the Lease is the leadership, its
// Token the term, Done closes when leadership is lost, Release resigns.
// The server must keep its leases in etcd; a server on Redis leases
// refuses, and the error matches lock.ErrElectionStore. Options as for
// lock.Client.Elect, except WithRetry (the server waits). The campaign is
// sent as requests of up to WithMaxRequestWait each, in one place in the
// queue (API field waiter), as Acquire's wait is.
func (c *Client) Elect(ctx context.Context, name, value string, ttl time.Duration, opts ...lock.Option) (*Lease, error) {
	o, err := lock.ResolveElectOptions(value, opts...)
	if err != nil {
		return nil, err
	}
	if o.Retry != nil {
		return nil, fmt.Errorf("%w: WithRetry does not apply to a fenced server's client: the server waits and is notified of releases; bound the wait with WithWait", lock.ErrInvalidOption)
	}
	l, err := c.acquire(ctx, name, ttl, o, true)
	return l, storeRefused(err)
}

// Observe reports who leads election name, first now and then at every
// change, as lock.Client.Observe does, by long polls of
// GET /v1/elections/{name} of up to WithMaxRequestWait each. It returns an
// error if the first request fails; a server that does not answer that
// one within WithAnswerGrace fails it (ErrNoAnswer), and it is sent again
// as a read is (WithRetries).
//
// A long poll that fails is sent again after a backoff (50ms to 1s), to
// the next server if there are several: one that could not be sent or was
// not answered (within its wait and WithAnswerGrace, else ErrNoAnswer),
// or answered 5xx. A server that refuses the wait asked for (400 on
// wait_ms: its --max-wait is shorter than WithMaxRequestWait) is asked at
// once for the longest it allows, as an Acquire does (WithMaxRequestWait).
// Any other 4xx answer
// (401, 403, 404, …), or a redirect (3xx), is taken as final: sending it again would be refused
// again, and the channel would show a leader that may be long gone. So is
// a server certificate the client does not trust (ErrCertificate), or a
// server that refuses the client's (ErrClientCertificate), which fails
// every handshake alike.
//
// The channel is closed when ctx ends or the client closes, and also,
// while ctx lives, after such a final refusal. A consumer that finds the
// channel closed with ctx still alive learns why by calling Observe again:
// its first request returns the refusal as its error (an *APIError), or
// lock.ErrClosed, or, if the refusal has passed (a token file reloaded,
// say), a new channel.
func (c *Client) Observe(ctx context.Context, name string) (<-chan lock.Leader, error) {
	if err := lock.ValidateName(name); err != nil {
		return nil, err
	}
	ctx, end, err := c.calls.Begin(ctx) // Close ends the long polls too
	if err != nil {
		return nil, fmt.Errorf("client: observe %q: %w", name, err)
	}
	first, err := c.leader(ctx, name, nil, 0)
	if err != nil {
		end()
		if cerr := c.calls.Ended(ctx); cerr != nil {
			err = cerr
		}
		return nil, fmt.Errorf("client: observe %q: %w", name, storeRefused(err))
	}
	out := make(chan lock.Leader)
	go func() { // owned by ctx and Close; it also ends after a final refusal
		defer end()
		defer close(out)
		cur := first
		const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
		backoff := minBackoff
		for {
			select {
			case out <- cur:
			case <-ctx.Done():
				return
			}
			for {
				after := cur.Token
				wait := c.requestWait()
				l, err := c.leader(ctx, name, &after, wait)
				if ctx.Err() != nil {
					return
				}
				if c.refusedWait(err, wait) {
					continue
				}
				if final(err) {
					return
				}
				if err != nil {
					if !clock.Sleep(ctx, backoff) {
						return
					}
					backoff = min(2*backoff, maxBackoff)
					continue
				}
				backoff = minBackoff
				if l != cur {
					cur = l
					break
				}
			}
		}
	}()
	return out, nil
}

// leader is one GET /v1/elections/{name}: at once, or waiting up to wait
// for a term other than *after.
func (c *Client) leader(ctx context.Context, name string, after *fence.Token, wait time.Duration) (lock.Leader, error) {
	path := electionPath(name, "")
	if after != nil {
		q := url.Values{api.FieldAfterToken: {strconv.FormatUint(uint64(*after), 10)}}
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if wait > 0 {
			q.Set(api.FieldWaitMs, strconv.FormatInt(max(wait.Milliseconds(), 1), 10))
		}
		path += "?" + q.Encode()
	}
	// A long poll must be answered within its wait and the grace, so that
	// a server that stops answering does not hold the observer for ever;
	// so must a read at once (Observe's first), within the grace alone:
	// its context is the whole observation's, which the caller cannot
	// bound for the first request only. A read at once is a short request,
	// sent again as the others are.
	mode, within := resendShared, c.answerGrace
	if wait > 0 {
		mode, within = resendAlways, wait+c.answerGrace
	}
	in := rebuilt(func() (attempt, bool) { return attempt{within: within}, true })
	var a api.Leader
	if err := c.do(ctx, http.MethodGet, path, in, &a, mode); err != nil {
		return lock.Leader{}, err
	}
	return a.Leader(), nil
}

// final reports whether err is an answer that the same request would get
// again: a redirect, or a 4xx other than 408 and 429; or a server
// certificate the client does not trust, or a client certificate the
// server refuses, which fails every handshake alike until the client is
// given the CA or its certificate.
func final(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status >= 300 && ae.Status < 500 && // a redirect too: it would come again
			ae.Status != http.StatusRequestTimeout && ae.Status != http.StatusTooManyRequests
	}
	return certificateFailure(err)
}

// storeRefused makes the server's refusal of elections on Redis leases (a
// 400 about no field of a request this client built) match
// lock.ErrElectionStore.
func storeRefused(err error) error {
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == api.CodeInvalidArgument && ae.Field == "" {
		return storeRefusal{err}
	}
	return err
}

// storeRefusal is err, matching lock.ErrElectionStore too, and saying only
// err's message: the server's says why and what to run instead.
type storeRefusal struct{ err error }

func (e storeRefusal) Error() string   { return e.err.Error() }
func (e storeRefusal) Unwrap() []error { return []error{lock.ErrElectionStore, e.err} }
