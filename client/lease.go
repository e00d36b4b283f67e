package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/lock"
)

// Lease is a lock held through a fenced server. It is lock.Lease itself,
// so code moves between the embedded lock package and the service without
// change: Token, TTL, Deadline, Refresh, Release, Done, Context, Err and
// keep-alive behave alike. Refresh and Release go through the server's API
// by lease id; a refresh answered 410 lost loses the lease.
type Lease = lock.Lease

// keeper is the lock.LeaseKeeper a Lease refreshes and releases through:
// the API, by lease id. Both are safe to send again, to any server, and
// each server but the last has only half of the time left (resendShared): a
// keep-alive refresh's context ends at the lease's deadline, and a server
// that stops answering must not use it all while another could refresh.
type keeper struct{ c *Client }

var _ lock.LeaseKeeper = keeper{}

// Refresh asks the server to extend the lease; the TTL must be whole
// milliseconds, the API's unit. seq goes with it (0: none), the same when
// it is sent again; to a server that does not know seq, the refresh goes
// again without it.
func (k keeper) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	if err := lock.ValidateTTL(ttl); err != nil {
		return lock.Grant{}, err
	}
	var a api.Lease
	ttlMs := ttl.Milliseconds()
	body := api.RefreshRequest{LeaseID: leaseID, TTLMs: &ttlMs}
	if seq != 0 {
		body.Seq = &seq
	}
	err := k.c.do(ctx, http.MethodPost, lockPath(name, "refresh"), body, &a, resendShared)
	if ae := (*APIError)(nil); seq != 0 && errors.As(err, &ae) && ae.Code == api.CodeInvalidArgument && ae.Field == "" {
		// A fenced older than seq refuses the field it does not know (the
		// body is otherwise valid, and a field of it would be named): a
		// client upgraded before its servers sends the refresh unordered,
		// as before, rather than lose its leases. The next one tries seq
		// again.
		body.Seq = nil
		err = k.c.do(ctx, http.MethodPost, lockPath(name, "refresh"), body, &a, resendShared)
	}
	if err != nil {
		return lock.Grant{}, fmt.Errorf("client: refresh %q: %w", name, err)
	}
	if a.TTLMs <= 0 || a.Token == 0 {
		return lock.Grant{}, fmt.Errorf("client: refresh %q: the server's answer lacks token or ttl_ms", name)
	}
	return lock.Grant{Token: a.Token, TTL: time.Duration(a.TTLMs) * time.Millisecond}, nil
}

// Release asks the server to release the lease. A release sent again by
// the lease id that released it succeeds on the server that released it,
// and with its release id takes off no second hold of a reentrant lock, so
// a lost answer is safe. Another server may know nothing of the release
// (with leases in etcd, each remembers its own): its "lost", after an
// attempt that got no answer, comes with lock.ErrSentAgain, which
// Lease.Release counts as released before the lease's deadline. A "lost"
// whose server says the store is sure (maybe_released false: the lease
// was gone before) is a loss, with neither mark; any other carries
// lock.ErrMaybeReleased.
func (k keeper) Release(ctx context.Context, name, leaseID, op string) error {
	if op == "" {
		var err error
		if op, err = lock.NewReleaseID(); err != nil {
			return fmt.Errorf("client: release %q: %w", name, err)
		}
	}
	body := api.ReleaseRequest{LeaseID: leaseID, ReleaseID: op}
	var unanswered bool
	if err := k.c.doNoting(ctx, http.MethodPost, lockPath(name, "release"), body, nil, resendShared, &unanswered); err != nil {
		var ae *APIError
		if !errors.Is(err, lock.ErrLost) || errors.As(err, &ae) && ae.LostForCertain {
			// A "lost" the store is sure of: the lease was gone before any
			// release of this one (docs/design.md, defect 190).
			return fmt.Errorf("client: release %q: %w", name, err)
		}
		if unanswered {
			return fmt.Errorf("client: release %q: %w: %w: %w", name, lock.ErrSentAgain, lock.ErrMaybeReleased, err)
		}
		return fmt.Errorf("client: release %q: %w: %w", name, lock.ErrMaybeReleased, err)
	}
	return nil
}
