package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fenced/fenced/lock"
)

// Lease is a lock held through a fenced server. It is lock.Lease itself,
// so code moves between the embedded lock package and the service without
// change: Token, TTL, Deadline, Refresh, Release, Done, Context, Err and
// keep-alive behave alike. Refresh and Release go through the server's API
// by lease id; a refresh answered 410 lost loses the lease.
type Lease = lock.Lease

// httpStore is the lock.LeaseStore a Lease refreshes and releases through.
// Acquisition goes through Client.Acquire instead, since the server makes
// the lease id and does the waiting.
type httpStore struct{ c *Client }

var _ lock.LeaseStore = httpStore{}

var errByServer = errors.New("client: acquisition and waiting happen on the server: use Client.Acquire")

func (httpStore) Acquire(context.Context, string, string, time.Duration) (lock.Grant, error) {
	return lock.Grant{}, errByServer
}

func (httpStore) Watch(context.Context, string) (<-chan struct{}, func(), error) {
	return nil, nil, errByServer
}

// Refresh asks the server to extend the lease; the TTL must be whole
// milliseconds, the API's unit.
func (s httpStore) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration) (lock.Grant, error) {
	if ttl%time.Millisecond != 0 {
		return lock.Grant{}, fmt.Errorf("%w: %s; want whole milliseconds", lock.ErrInvalidTTL, ttl)
	}
	var a leaseAnswer
	if err := s.c.do(ctx, http.MethodPost, lockPath(name, "refresh"), refreshBody{LeaseID: leaseID, TTLMs: ttl.Milliseconds()}, &a); err != nil {
		return lock.Grant{}, fmt.Errorf("client: refresh %q: %w", name, err)
	}
	if a.TTLMs <= 0 || a.Token == 0 {
		return lock.Grant{}, fmt.Errorf("client: refresh %q: the server's answer lacks token or ttl_ms", name)
	}
	return lock.Grant{Token: a.Token, TTL: time.Duration(a.TTLMs) * time.Millisecond}, nil
}

func (s httpStore) Release(ctx context.Context, name, leaseID string) error {
	if err := s.c.do(ctx, http.MethodPost, lockPath(name, "release"), releaseBody{LeaseID: leaseID}, nil); err != nil {
		return fmt.Errorf("client: release %q: %w", name, err)
	}
	return nil
}

func (s httpStore) Inspect(ctx context.Context, name string) (lock.State, error) {
	return s.c.Inspect(ctx, name)
}

func (s httpStore) Ping(ctx context.Context) error {
	return s.c.do(ctx, http.MethodGet, "/readyz", nil, nil)
}
