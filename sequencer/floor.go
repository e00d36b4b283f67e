package sequencer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/etcdkv"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// floorKV is the floor key as read: its offset and mod revision (0: no
// floor was ever set).
type floorKV struct {
	offset uint64
	modRev int64
}

// parseFloorKV reads the floor key from a range response; no key means
// offset 0 and mod revision 0.
func parseFloorKV(rr *pb.RangeResponse) (floorKV, error) {
	if rr == nil || len(rr.Kvs) == 0 {
		return floorKV{}, nil
	}
	kv := rr.Kvs[0]
	v, err := strconv.ParseUint(string(kv.Value), 10, 64)
	if err != nil {
		return floorKV{}, fmt.Errorf("%w: %q holds %q; was it written by hand?", ErrBadFloor, kv.Key, kv.Value)
	}
	return floorKV{offset: v, modRev: kv.ModRevision}, nil
}

// Floor is the state of the token floor.
type Floor struct {
	Offset   uint64      // added to every revision
	Revision int64       // etcd's revision when read
	Next     fence.Token // a lower bound on the next token
	// Issued says whether any token was issued under the prefix in this
	// cluster: its counter key, which every token Txn writes, exists. A
	// prefix fenced never served, or a new cluster, has none.
	Issued bool
}

// Exhausted reports whether the next token would pass fence.MaxToken: no
// token is left, and issuers return ErrTokensExhausted.
func (f Floor) Exhausted() bool { return f.Next > fence.MaxToken }

// MaxMinToken (2^62) is the largest min RaiseFloor takes. A floor above it
// leaves fewer than 2^62 tokens below 2^63, and nothing lowers a floor, so
// a larger min is a typo (a digit too many) that would use the tokens up
// for good: today's tokens are near 1.8e15, the clock in microseconds. The
// bound is on the caller's min only: a floor already above it (set by
// hand, or by an older fenced) is still raised.
const MaxMinToken fence.Token = 1 << 62

// ErrMinTokenTooHigh is returned by RaiseFloor for a min above
// MaxMinToken; the floor is left as it was.
var ErrMinTokenTooHigh = errors.New("sequencer: min token too high")

// ReadFloor returns the floor offset and the current revision of the
// keyspace under prefix ("" means DefaultPrefix).
func ReadFloor(ctx context.Context, cli *clientv3.Client, prefix string) (Floor, error) {
	ks := NewKeyspace(prefix)
	f, err := readFloor(ctx, cli, ks)
	if err != nil {
		return Floor{}, err
	}
	f.Issued, err = issued(ctx, cli, ks)
	return f.Floor, err
}

// RaiseFloor makes every token issued from now on greater than min, greater
// than every token this etcd cluster has issued, and greater than the
// current time in microseconds since the Unix epoch. It is the step to run
// after etcd was restored from an older snapshot or replaced by a new
// cluster (see the package doc). It returns the new floor: every later
// token exceeds Floor.Next-1.
//
// Tokens stay below 2^63, so they fit a signed 64-bit column, for about
// 290,000 years of clock. A min above MaxMinToken (2^62) is refused with
// ErrMinTokenTooHigh, and a floor that would leave no token up to
// fence.MaxToken with ErrTokensExhausted; an issuer whose next token would
// pass it returns ErrTokensExhausted.
func RaiseFloor(ctx context.Context, cli *clientv3.Client, prefix string, min fence.Token) (Floor, error) {
	if min > MaxMinToken {
		return Floor{}, fmt.Errorf("%w: min token %d is above 2^62 (%d), which would leave fewer than 2^62 tokens below 2^63, "+
			"and nothing lowers a floor once raised (a digit too many?); give the highest token your resources have seen, "+
			"or none: the clock in microseconds (now %d) and the tokens etcd issued count anyway",
			ErrMinTokenTooHigh, uint64(min), uint64(MaxMinToken), time.Now().UnixMicro())
	}
	ks := NewKeyspace(prefix)
	was, err := issued(ctx, cli, ks)
	if err != nil {
		return Floor{}, err
	}
	f, _, err := raiseFloor(ctx, cli, prefix, min, false)
	f.Issued = was
	return f, err
}

// issued reports whether the counter key under ks exists: whether any
// token was issued there in this cluster.
func issued(ctx context.Context, cli *clientv3.Client, ks Keyspace) (bool, error) {
	resp, err := etcdkv.New(cli).Get(clientv3.WithRequireLeader(ctx), ks.CounterKey(), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("sequencer: read the counter key: %w", err)
	}
	return resp.Count > 0, nil
}

// raiseFloor raises the floor; with onlyIfNew, only if no floor was ever
// set, and it reports whether it raised.
func raiseFloor(ctx context.Context, cli *clientv3.Client, prefix string, min fence.Token, onlyIfNew bool) (Floor, bool, error) {
	ks := NewKeyspace(prefix)
	for {
		cur, err := readFloor(ctx, cli, ks)
		if err != nil {
			return Floor{}, false, err
		}
		if onlyIfNew && cur.modRev != 0 {
			return cur.Floor, false, nil
		}
		target := uint64(min)
		if now := uint64(time.Now().UnixMicro()); now > target {
			target = now
		}
		if live := uint64(cur.Next); live > target {
			target = live
		}
		// The next token is at least target+2 (the put's revision is
		// cur.Revision+1 or later, the next Txn's after it): it must not
		// pass fence.MaxToken, which no fence admits.
		if target > uint64(fence.MaxToken)-2 {
			return Floor{}, false, fmt.Errorf("%w: floor %d leaves no token up to %d (2^63-1, the largest a signed 64-bit column holds); nothing lowers a floor",
				ErrTokensExhausted, target, uint64(fence.MaxToken))
		}
		// The put takes revision cur.Revision+1 (or later if someone writes
		// first, which only makes tokens larger); offset so that
		// revision+offset > target.
		offset := target - uint64(cur.Revision)
		key := ks.FloorKey()
		resp, err := etcdkv.New(cli).Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.modRev)).
			Then(clientv3.OpPut(key, strconv.FormatUint(offset, 10))).
			Commit()
		if err != nil {
			return Floor{}, false, fmt.Errorf("sequencer: raise floor: %w", err)
		}
		if resp.Succeeded {
			return Floor{Offset: offset, Revision: resp.Header.Revision, Next: Token(resp.Header.Revision+1, offset)}, true, nil
		}
		// Someone else raised the floor at the same moment: read it again.
	}
}

// EnsureFloor raises the floor (as RaiseFloor with no minimum) if it was
// never set: a new, empty cluster then issues tokens above those of any
// cluster before it, so a fresh data dir cannot reissue old tokens to
// resources that remember them. A cluster restored from a snapshot already
// has a floor and still needs RaiseFloor. It reports whether it raised.
func EnsureFloor(ctx context.Context, cli *clientv3.Client, prefix string) (Floor, bool, error) {
	return raiseFloor(ctx, cli, prefix, 0, true)
}

type floorRev struct {
	Floor
	modRev int64
}

// readFloor is ReadFloor plus the floor key's mod revision.
func readFloor(ctx context.Context, cli *clientv3.Client, ks Keyspace) (floorRev, error) {
	// A linearizable read: a member without a leader refuses it at once,
	// and etcdkv asks the next, or says so; one cut off from its peers
	// that has not noticed yet holds it, and etcdkv sends it again
	// (defects 108, 109).
	resp, err := etcdkv.New(cli).Get(clientv3.WithRequireLeader(ctx), ks.FloorKey())
	if err != nil {
		return floorRev{}, fmt.Errorf("sequencer: read floor: %w", err)
	}
	f, err := parseFloorKV((*pb.RangeResponse)(resp))
	if err != nil {
		return floorRev{}, err
	}
	return floorRev{Floor{Offset: f.offset, Revision: resp.Header.Revision, Next: Token(resp.Header.Revision+1, f.offset)}, f.modRev}, nil
}

func quietLogger() *zap.Logger {
	l, err := zap.NewProduction(zap.IncreaseLevel(zap.ErrorLevel))
	if err != nil {
		return zap.NewNop()
	}
	return l
}
