package sequencer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/internal/etcdkv"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Keyspace names fenced's keys in etcd under one prefix. The sequencer and
// lock.EtcdStore share it, so that a prefix means the same keys everywhere
// and RaiseFloor applies to both (docs/design.md, "Keys and tokens").
//
//	<prefix>floor           the offset added to every revision (RaiseFloor)
//	<prefix>counter         written by every token Txn of the sequencer
//	<prefix>locks/<name>          a lock held with an etcd lease; value: the lease id,
//	                              a space, and its floor offset, owner and holder (LockInfo, JSON)
//	<prefix>count/<name>          its reentrancy count, when it has a holder
//	<prefix>queue/<name>/<slot>   a fair waiter's place (lock.EtcdStore names it by a slot of its own); value: when it arrived
//
// Nothing is kept per lock name once its lock is free: the state is bounded
// by the locks held now.
type Keyspace struct{ prefix string }

// NewKeyspace returns the keyspace under prefix; "" means DefaultPrefix.
func NewKeyspace(prefix string) Keyspace {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Keyspace{prefix: prefix}
}

// Prefix is the keyspace's prefix.
func (k Keyspace) Prefix() string { return k.norm().prefix }

// FloorKey holds the floor offset.
func (k Keyspace) FloorKey() string { return k.Prefix() + "floor" }

// CounterKey is the key every sequencer Txn writes, to make a revision.
func (k Keyspace) CounterKey() string { return k.Prefix() + "counter" }

// CounterPut is a token Txn's write of the counter key. Its value is the
// floor offset the token is made with, so that an issuer following the key
// counts other processes' tokens as they were issued, not with an offset
// of its own that may be older (docs/design.md, defect 160).
func (k Keyspace) CounterPut(offset uint64) clientv3.Op {
	return clientv3.OpPut(k.CounterKey(), strconv.FormatUint(offset, 10))
}

// LockKey is the key of a lock held with an etcd lease.
func (k Keyspace) LockKey(name string) string { return k.Prefix() + "locks/" + name }

// LocksPrefix is the prefix of every LockKey.
func (k Keyspace) LocksPrefix() string { return k.Prefix() + "locks/" }

// CountKey is a reentrant lock's count, when it has a holder.
func (k Keyspace) CountKey(name string) string { return k.Prefix() + "count/" + name }

// QueuePrefix is the prefix of lock name's fair-waiting queue.
func (k Keyspace) QueuePrefix(name string) string { return k.Prefix() + "queue/" + name + "/" }

// QueueKey is waiter's place in lock name's queue.
func (k Keyspace) QueueKey(name, waiter string) string { return k.QueuePrefix(name) + waiter }

// norm makes the zero Keyspace the default one.
func (k Keyspace) norm() Keyspace {
	if k.prefix == "" {
		return Keyspace{prefix: DefaultPrefix}
	}
	return k
}

// ErrRestored is returned when etcd handed out a revision that makes a
// token no larger than one this process already issued: etcd was restored
// from an older snapshot (or replaced) without RaiseFloor. The issuer has
// raised the floor by then; the caller retries.
var ErrRestored = errors.New("sequencer: etcd's revision went back below tokens already issued; the floor was raised")

// ErrTokensExhausted is returned when the next token would pass
// fence.MaxToken (2^63-1): the floor was raised so high that no token is
// left above it, or this process has seen a token at 2^63-1 and issues
// none lower. Only a floor set by hand (RaiseFloor takes no min above
// MaxMinToken) comes near it. Waiting does not mend it: nothing lowers a
// floor; a new keyspace (WithPrefix) or a new cluster starts again.
var ErrTokensExhausted = errors.New("sequencer: no token left below 2^63 (fence.MaxToken) above the floor")

// ErrBadFloor is returned when the floor key does not hold a number: only
// a hand-written one does, and no token can be issued until it is mended.
var ErrBadFloor = errors.New("sequencer: the floor key does not hold a number")

// Issuer runs the etcd Txns whose revisions become tokens, and is the one
// place where a revision and a floor offset become a token.
//
// It keeps the floor offset it last read and guards every Txn with the
// floor key's value, so a Txn never pairs its revision with an
// offset the floor no longer has, at no extra round trip. On a cluster
// with no floor it sets one (EnsureFloor), so a library user on a fresh or
// replaced cluster never gets small tokens again. And when a Txn's token is
// not above one this process issued before that Txn began, etcd went back
// in time: it raises the floor and reports ErrRestored.
type Issuer struct {
	cli *clientv3.Client
	kv  clientv3.KV // cli's, sending a request refused for want of a leader on (etcdkv)
	ks  Keyspace
	log *slog.Logger

	mu      sync.Mutex
	offset  uint64
	modRev  int64       // the floor key's mod revision when read; -1: not read yet
	highest fence.Token // the largest token of a completed Txn
}

// NewIssuer returns an issuer of tokens in ks. log receives a warning when
// etcd's revision goes back; nil means slog.Default().
func NewIssuer(cli *clientv3.Client, ks Keyspace, log *slog.Logger) *Issuer {
	if log == nil {
		log = slog.Default()
	}
	return &Issuer{cli: cli, kv: etcdkv.New(cli), ks: ks.norm(), log: log, modRev: -1}
}

// Keyspace is the issuer's keyspace.
func (i *Issuer) Keyspace() Keyspace { return i.ks }

// Follow watches the counter key, which every token Txn in the keyspace
// writes (the sequencer's and lock.EtcdStore's), so that the issuer learns
// the tokens other processes issue, not only its own. After etcd is
// restored from an older snapshot, any process that was following then
// sees its next token fall below one it has seen, and raises the floor:
// not only the process that issued the newest tokens. A token the issuer
// has not seen yet when the restore happens (a window of a watch event's
// delivery) is not covered; the raise-floor step is. stop ends the watch
// and waits for it.
func (i *Issuer) Follow() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // owned by stop
		defer close(done)
		// etcd ends a watch for good when the history it has yet to send
		// was compacted (a follower cut off for longer than etcd keeps
		// history): watch again, from the compaction, counted as a token
		// seen. That is safe: every later token is above it.
		var from int64 // 0: from now
		for {
			var opts []clientv3.OpOption
			if from > 0 {
				opts = append(opts, clientv3.WithRev(from))
			}
			// A member that loses its leader ends the watch (defect
			// 108): on one cut off from its peers it would see nothing.
			for wr := range i.cli.Watch(clientv3.WithRequireLeader(ctx), i.ks.CounterKey(), opts...) {
				for _, ev := range wr.Events {
					i.observe(ctx, ev.Kv.ModRevision, ev.Kv.Value)
					from = ev.Kv.ModRevision + 1
				}
				if wr.CompactRevision > 0 {
					i.observe(ctx, wr.CompactRevision, nil)
					from = wr.CompactRevision
				}
			}
			if !clock.Sleep(ctx, 100*time.Millisecond) {
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// observe counts a revision written to the counter key as a token issued,
// with the floor offset the write records (value). A write without one (a
// compaction's revision, or a writer older than defect 160's fix) counts
// with the floor offset known now: a Txn sent later has a larger revision
// and, once it has read the floor, that same offset or a larger one. An
// issuer that has read no floor yet (it has issued nothing) reads it now:
// else it would count none of the tokens others issue until its own first
// Txn, and that Txn, after a restore, could repeat one of them.
func (i *Issuer) observe(ctx context.Context, rev int64, value []byte) {
	if off, err := strconv.ParseUint(string(value), 10, 64); err == nil {
		i.mu.Lock()
		i.highest = max(i.highest, Token(rev, off))
		i.mu.Unlock()
		return
	}
	i.mu.Lock()
	known := i.modRev >= 0
	i.mu.Unlock()
	if !known {
		f, err := readFloor(ctx, i.cli, i.ks)
		if err != nil || f.modRev == 0 {
			return // no floor yet: the first Txn sets one above every token
		}
		i.mu.Lock()
		if i.modRev < 0 {
			i.offset, i.modRev = f.Offset, f.modRev
		}
		i.mu.Unlock()
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.modRev < 0 {
		return
	}
	if tok := Token(rev, i.offset); tok > i.highest {
		i.highest = tok
	}
}

// Issue commits one Txn: if every cmp holds, then(offset) runs and its
// revision plus offset is the token; offset is the floor offset the token
// is made with, for ops that record it. ok is false when a cmp of the
// caller's failed; resp.Responses then start with the results of els. els
// also run when only the floor guard failed (the Txn is then sent again),
// so they must be reads. Requests fail fast when the etcd member has no
// leader.
//
// A Txn that wrote nothing has no revision of its own (the header carries
// the last write's), so its "token" is no token. used says whether the
// Txn's writes make a token that someone will use (nil: whenever ok); only
// those are checked against the tokens issued before, and counted.
func (i *Issuer) Issue(ctx context.Context, cmps []clientv3.Cmp, then func(offset uint64) []clientv3.Op, used func(*clientv3.TxnResponse) bool, els ...clientv3.Op) (resp *clientv3.TxnResponse, tok fence.Token, ok bool, err error) {
	ctx = clientv3.WithRequireLeader(ctx)
	floorKey := i.ks.FloorKey()
	// Each pass that does not return read a newer floor; more than a few in
	// a row means something keeps rewriting it.
	for range 8 {
		i.mu.Lock()
		offset, modRev, highest := i.offset, i.modRev, i.highest
		i.mu.Unlock()
		// No floor (0), or not read yet (-1, which never matches).
		floorCmp := clientv3.Compare(clientv3.ModRevision(floorKey), "=", modRev)
		if modRev > 0 {
			// The value, what the token is made of, not the mod revision:
			// that names a floor only within one cluster's history, and a
			// new cluster's floor, its first write, has the same one as an
			// old cluster's never raised (defect 159).
			floorCmp = clientv3.Compare(clientv3.Value(floorKey), "=", strconv.FormatUint(offset, 10))
		}
		guarded := append(cmps[:len(cmps):len(cmps)], floorCmp)
		resp, err = i.kv.Txn(ctx).If(guarded...).Then(then(offset)...).Else(append(els[:len(els):len(els)], clientv3.OpGet(floorKey))...).Commit()
		if err != nil {
			return nil, 0, false, err
		}
		if !resp.Succeeded {
			fr := resp.Responses[len(resp.Responses)-1].GetResponseRange()
			cur, err := parseFloorKV(fr)
			if err != nil {
				return nil, 0, false, err
			}
			if cur.modRev == modRev && cur.offset == offset {
				return resp, 0, false, nil // the floor held: a cmp of the caller's failed
			}
			if cur.modRev == 0 { // no floor: a new or replaced cluster (-1 never matches a key)
				if _, _, err := EnsureFloor(ctx, i.cli, i.ks.Prefix()); err != nil {
					return nil, 0, false, err
				}
				continue // read it through the next Txn's Else
			}
			i.setFloor(cur.offset, cur.modRev)
			continue
		}
		tok = Token(resp.Header.Revision, offset)
		if used != nil && !used(resp) {
			return resp, tok, true, nil
		}
		if tok > fence.MaxToken {
			// No fence admits it: the revision passed what the floor left
			// room for. The Txn committed; its token is never used.
			return nil, 0, false, fmt.Errorf("%w: revision %d plus floor offset %d is %d", ErrTokensExhausted, resp.Header.Revision, offset, uint64(tok))
		}
		if tok <= highest {
			if err := i.restored(ctx, tok, highest); err != nil {
				return nil, 0, false, err
			}
			return resp, 0, true, ErrRestored
		}
		i.mu.Lock()
		if tok > i.highest {
			i.highest = tok
		}
		i.mu.Unlock()
		return resp, tok, true, nil
	}
	return nil, 0, false, fmt.Errorf("sequencer: the floor key %s changed under 8 Txns in a row; is something rewriting it?", floorKey)
}

// seenMax is the ErrTokensExhausted of an issuer that has seen highest,
// a token at or above fence.MaxToken (a Txn that found none left counts:
// its counter write is seen, its token never used).
func (i *Issuer) seenMax(highest fence.Token) error {
	return fmt.Errorf("%w: this process saw the tokens under %s reach %d and issues none lower, whatever the floor in etcd is now; only a restart makes it forget",
		ErrTokensExhausted, i.ks.Prefix(), uint64(highest))
}

// Ping checks that the issuer can issue a token: etcd can take writes
// (PingEtcd), the floor leaves a token below 2^63, and this process has
// not seen token 2^63-1. Either of the last two is ErrTokensExhausted,
// which no waiting mends: /readyz says so rather than ready.
func (i *Issuer) Ping(ctx context.Context) error {
	i.mu.Lock()
	highest := i.highest
	i.mu.Unlock()
	if highest >= fence.MaxToken {
		return i.seenMax(highest)
	}
	// One read: the floor's value, where PingEtcd counts the key.
	f, err := readFloor(ctx, i.cli, i.ks)
	if err != nil {
		return err
	}
	if f.Exhausted() {
		return fmt.Errorf("%w: under %s, revision %d plus floor offset %d is %d", ErrTokensExhausted, i.ks.Prefix(), f.Revision+1, f.Offset, uint64(f.Next))
	}
	return alarms(ctx, i.cli)
}

// setFloor caches the floor as last read. The newest read wins, even with
// a lower mod revision: a restored cluster's floor has one.
func (i *Issuer) setFloor(offset uint64, modRev int64) {
	i.mu.Lock()
	i.offset, i.modRev = offset, modRev
	i.mu.Unlock()
}

// restored raises the floor above the highest token issued before, after
// a Txn that began later got a token no larger than it.
func (i *Issuer) restored(ctx context.Context, tok, highest fence.Token) error {
	if highest >= fence.MaxToken {
		// No token exceeds it: this process must never issue one again
		// (guarantee 1), whatever floor etcd now has.
		return i.seenMax(highest)
	}
	i.log.Warn("etcd's revision went back: a token would not exceed one already issued; raising the token floor",
		"token", uint64(tok), "highest_issued", uint64(highest), "prefix", i.ks.Prefix(),
		"hint", "etcd was restored from an older snapshot or replaced; run fenced admin raise-floor on every restore before serving")
	// Not RaiseFloor: its bound on min (MaxMinToken) is for a min a person
	// types; a floor above it, set by hand, still has tokens left.
	if _, _, err := raiseFloor(ctx, i.cli, i.ks.Prefix(), highest+1, false); err != nil {
		return fmt.Errorf("sequencer: raise the floor after etcd went back: %w", err)
	}
	i.mu.Lock()
	i.modRev = -1 // the next Txn reads the new floor through its guard
	i.mu.Unlock()
	return nil
}

// Locks held with etcd leases (lock.EtcdStore). The package that owns the
// keyspace hands out the compares and ops, as etcd's Mutex.IsOwner does,
// so that the store never re-derives keys or token arithmetic.

// LockInfo is what a lock held with an etcd lease records beside its key:
// the floor offset its token was made with, and the labels of its holder.
type LockInfo struct {
	Offset uint64 `json:"offset"`
	Owner  string `json:"owner,omitempty"`  // a label for people: who holds it
	Holder string `json:"holder,omitempty"` // the holder's identity, for reentrancy
	// Waiter is the place of a remote acquisition (a fenced server's
	// caller), so that its next request finds a grant whose answer was
	// lost; empty otherwise.
	Waiter string `json:"waiter,omitempty"`
}

// LockFree is the compare that lock name is not held.
func (k Keyspace) LockFree(name string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(k.LockKey(name)), "=", 0)
}

// LockTaken is the compare that lock name is held, by anyone: LockFree's
// opposite.
func (k Keyspace) LockTaken(name string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(k.LockKey(name)), ">", 0)
}

// LockHeldBy are the compares that leaseID holds lock name: its key's
// value lies between leaseID+" " and leaseID+"!", so it is leaseID, a
// space and the info (lockValue), and no other lease id's, as no lease id
// holds a space. They never hold for an id that does.
func (k Keyspace) LockHeldBy(name, leaseID string) []clientv3.Cmp {
	key := k.LockKey(name)
	if leaseID == "" || strings.Contains(leaseID, " ") {
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "<", 0)}
	}
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(key), ">", leaseID+" "),
		clientv3.Compare(clientv3.Value(key), "<", leaseID+"!"),
	}
}

// lockValue is a lock key's value: the lease id, a space, and the info as
// JSON. The info rides in the lock's own key, not in a key of its own: a
// second key per lock, written with each grant and deleted with each
// release, cost 16% of the throughput of 64 clients (docs/design.md, "One
// key per lock").
func lockValue(leaseID string, info LockInfo) string {
	b, _ := json.Marshal(info) // a struct of strings and a number
	return leaseID + " " + string(b)
}

// LeaseIDOf is the lease id a lock key's value holds.
func LeaseIDOf(value []byte) string {
	id, _, _ := strings.Cut(string(value), " ")
	return id
}

// NotReentered is the compare that lock name has no reentrancy count: a
// release then frees it at once.
func (k Keyspace) NotReentered(name string) clientv3.Cmp {
	return clientv3.Compare(clientv3.Version(k.CountKey(name)), "=", 0)
}

// CountAt is the compare that lock name's reentrancy count is as read: its
// key's mod revision is rev (LockState.CountRev).
func (k Keyspace) CountAt(name string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(k.CountKey(name)), "=", rev)
}

// MaxCountOps is how many release ids, and reentries' marks (a waiter
// after "w", or an attempt's lease id), a count keeps (LockState.Ops).
const MaxCountOps = 8

// PutLock takes lock name for leaseID on the etcd lease: the lock key,
// holding its info (the floor offset its token is made with), and for a
// holder a reentrancy count of 1, attached to the lease so they go
// together. Use it in Issue's then.
func (k Keyspace) PutLock(name, leaseID string, lease clientv3.LeaseID, info LockInfo) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpPut(k.LockKey(name), lockValue(leaseID, info), clientv3.WithLease(lease))}
	if info.Holder != "" {
		ops = append(ops, clientv3.OpPut(k.CountKey(name), "1", clientv3.WithLease(lease)))
	}
	return ops
}

// PutCount sets lock name's reentrancy count, on the lease the lock is on,
// with the ids of the last releases that counted it down (at most
// MaxCountOps, the newest last): the value is the count, then a space and
// the ids joined by commas.
func (k Keyspace) PutCount(name string, n int, ops []string, lease clientv3.LeaseID) clientv3.Op {
	v := strconv.Itoa(n)
	if len(ops) > MaxCountOps {
		ops = ops[len(ops)-MaxCountOps:]
	}
	if len(ops) > 0 {
		v += " " + strings.Join(ops, ",")
	}
	return clientv3.OpPut(k.CountKey(name), v, clientv3.WithLease(lease))
}

// GetLock reads lock name; ParseLock reads the two responses.
func (k Keyspace) GetLock(name string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(k.LockKey(name)), clientv3.OpGet(k.CountKey(name))}
}

// DeleteLock frees lock name.
func (k Keyspace) DeleteLock(name string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpDelete(k.LockKey(name)), clientv3.OpDelete(k.CountKey(name))}
}

// DeletePlainLock frees lock name, taken with no reentrant holder: such a
// lock never has a count key, so the Txn deletes its key alone.
func (k Keyspace) DeletePlainLock(name string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpDelete(k.LockKey(name))}
}

// MoveLock moves lock name, values and token unchanged, onto the etcd lease
// lease: a holder refreshing through another store. Its count moves too
// when it has one.
func (k Keyspace) MoveLock(name string, lease clientv3.LeaseID) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpPut(k.LockKey(name), "", clientv3.WithIgnoreValue(), clientv3.WithLease(lease)),
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Version(k.CountKey(name)), ">", 0)},
			[]clientv3.Op{clientv3.OpPut(k.CountKey(name), "", clientv3.WithIgnoreValue(), clientv3.WithLease(lease))}, nil),
	}
}

// LockState is a lock held with an etcd lease, as read by GetLock.
type LockState struct {
	LeaseID string           // the holder's lease id
	Token   fence.Token      // the token it was granted; it never changes
	Lease   clientv3.LeaseID // the etcd lease the keys are attached to
	Owner   string
	Holder  string
	Waiter  string // the remote acquisition it was granted to (LockInfo.Waiter)
	Count   int    // reentrancy count; 1 when not reentrant
	ModRev  int64
	// CountRev is the count key's mod revision (0: none), and Ops the ids
	// of the releases that last counted it down and the marks of the
	// reentries that last counted it up (PutCount): a release or a
	// reentry sent again finds its id there and counts nothing.
	CountRev int64
	Ops      []string
}

// ParseLock reads the responses of GetLock, the lock key's and the count
// key's (count may be nil); held is false when the lock is free. The token
// is the lock key's create revision plus the offset recorded when it was
// granted, not today's floor: RaiseFloor does not change a held lock's
// token.
func (k Keyspace) ParseLock(lock, count *pb.RangeResponse) (st LockState, held bool, err error) {
	if lock == nil || len(lock.Kvs) == 0 {
		return LockState{}, false, nil
	}
	kv := lock.Kvs[0]
	id, raw, found := strings.Cut(string(kv.Value), " ")
	st = LockState{LeaseID: id, Lease: clientv3.LeaseID(kv.Lease), Count: 1, ModRev: kv.ModRevision}
	var info LockInfo
	// No info only if the key was written by hand (or by a fenced from
	// before 2026-12-04, which kept it in a key of its own): offset 0 then
	// makes a token every fence rejects, never one it wrongly admits.
	if found {
		if err := json.Unmarshal([]byte(raw), &info); err != nil {
			return LockState{}, false, fmt.Errorf("sequencer: lock key %q holds %q: %v", kv.Key, kv.Value, err)
		}
	}
	st.Token, st.Owner, st.Holder, st.Waiter = Token(kv.CreateRevision, info.Offset), info.Owner, info.Holder, info.Waiter
	if count != nil && len(count.Kvs) == 1 {
		n, ops, _ := strings.Cut(string(count.Kvs[0].Value), " ")
		if n, err := strconv.Atoi(n); err == nil && n > 0 {
			st.Count = n
		}
		st.CountRev = count.Kvs[0].ModRevision
		if ops != "" {
			st.Ops = strings.Split(ops, ",")
		}
	}
	return st, true, nil
}

// Fair waiting: a waiter's place is a key under the lock's queue prefix,
// attached to its store's session lease, so it goes if its process dies.
// Its create revision orders the queue; its value is when it arrived (Unix
// ms).

// QueueEmpty is the compare that nobody waits in lock name's queue.
func (k Keyspace) QueueEmpty(name string) clientv3.Cmp {
	return clientv3.Compare(clientv3.Version(k.QueuePrefix(name)), "=", 0).WithPrefix()
}

// QueueHeadIs is the compare that the waiter whose place was created at
// revision rev is the oldest in lock name's queue.
func (k Keyspace) QueueHeadIs(name string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(k.QueuePrefix(name)), ">", rev-1).WithPrefix()
}

// JoinQueue puts a waiter's place, queue key key (see QueueKey), in its
// lock's queue. A key that is there already keeps its place.
func (k Keyspace) JoinQueue(key string, lease clientv3.LeaseID, arrived time.Time) clientv3.Op {
	return clientv3.OpPut(key, strconv.FormatInt(arrived.UnixMilli(), 10), clientv3.WithLease(lease))
}
