// Package etcdkv is the etcd KV that fenced's stores and sequencer write
// through: clientv3's, except that a request a member refused for having
// no leader goes again, at once, to the next member.
//
// A request marked WithRequireLeader that reaches a member without a
// leader is refused before it runs ("etcdserver: no leader", by etcd's
// gRPC interceptor). clientv3 sends a refused Range again, to the next
// member (round robin), but no Put, Delete or Txn: it cannot tell this
// refusal from a failure after the request ran. So a member cut off from
// its peers, while the others keep a quorum and its clients still reach
// it, failed every write and Txn the balancer gave it: a third of
// fenced's with three members (docs/design.md, defect 107). Sending the
// refused request on is safe for the same reason clientv3 does it for a
// Range: nothing ran. A Get goes as a read-only Txn: clientv3 sends a
// refused Range again until its caller's deadline, even to the same
// member, and the caller learned of a timeout, not of the missing leader
// (defect 109); eight sends, then the refusal is the answer.
//
// A member cut off from its peers still takes what reaches it before it
// notices it has no leader, and holds it unanswered until etcd's request
// timeout (defect 108). A Get or read-only Txn so held is sent again
// after Stall, to each other member (defect 112), and the first answer is
// taken: reads are safe to send twice. A write is not: etcd cannot say
// whether one it took and lost applied. Hedge does the same for reads
// outside the KV (a lease's TimeToLive).
package etcdkv

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Attempts bounds the sends of one request. The balancer gives each
// request of the client the next member in turn, so concurrent requests
// may take a resent one's turn; eight tries leave an isolated member of
// three a chance of 3^-8 to take them all. When no member has a leader
// (an election), the request fails after eight refusals, a few
// milliseconds, as it did after one.
const Attempts = 8

// Stall is how long a Txn of a batch may go unanswered before the next
// batch goes out beside it (groupcommit.Committer.Stall). A member cut
// off from its peers takes what reaches it before it notices it has no
// leader (an election timeout, 1 s by default), and holds it unanswered
// for etcd's request timeout (5 s plus two election timeouts): one Txn
// held so must not hold every later one (defect 108). An answer takes a
// few milliseconds here, and under a slow disk far less than this; a
// Txn stalled for nothing costs one more in flight.
const Stall = 500 * time.Millisecond

// New is cli's KV (cli.KV, so a wrapper a user set there, such as
// namespace.NewKV, stays) with refused requests sent again.
func New(cli *clientv3.Client) clientv3.KV { return resending{cli.KV, cli} }

type resending struct {
	clientv3.KV
	cli *clientv3.Client // its endpoints, for Hedge
}

func (r resending) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return resend(func() (*clientv3.PutResponse, error) { return r.KV.Put(ctx, key, val, opts...) })
}

// Get is a read-only Txn of the one Get: hedged, and a refusal sent on as
// a Txn's is. Not clientv3's Get, which sends a Range refused for want of
// a leader again and again until ctx ends (to the same member, for a
// client of one), so a caller learns "context deadline exceeded", never
// that etcd has no leader (defect 109).
func (r resending) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := r.Txn(ctx).Then(clientv3.OpGet(key, opts...)).Commit()
	if err != nil {
		return nil, err
	}
	get := (*clientv3.GetResponse)(resp.Responses[0].GetResponseRange())
	get.Header = resp.Header
	return get, nil
}

func (r resending) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	return resend(func() (*clientv3.DeleteResponse, error) { return r.KV.Delete(ctx, key, opts...) })
}

func (r resending) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	return resend(func() (clientv3.OpResponse, error) { return r.KV.Do(ctx, op) })
}

func (r resending) Txn(ctx context.Context) clientv3.Txn { return &txn{kv: r.KV, cli: r.cli, ctx: ctx} }

// txn records a Txn's parts, and builds it anew on kv for each send. As
// clientv3's, If, Then and Else are each called once; their slices are
// kept, not copied (every Txn of fenced is built and committed at once):
// a copy of each cost five allocations and 1 KB an acquire+release pair.
type txn struct {
	kv        clientv3.KV
	cli       *clientv3.Client
	ctx       context.Context
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

func (t *txn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.cmps = cs; return t }
func (t *txn) Then(ops ...clientv3.Op) clientv3.Txn { t.then = ops; return t }
func (t *txn) Else(ops ...clientv3.Op) clientv3.Txn { t.els = ops; return t }

func (t *txn) Commit() (*clientv3.TxnResponse, error) {
	send := func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return resend(func() (*clientv3.TxnResponse, error) {
			return t.kv.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
		})
	}
	if !reads(t.then) || !reads(t.els) {
		return send(t.ctx)
	}
	return Hedge(t.ctx, t.cli, send)
}

// reads reports whether ops only read.
func reads(ops []clientv3.Op) bool {
	for _, op := range ops {
		switch {
		case op.IsGet():
		case op.IsTxn():
			_, then, els := op.Txn()
			if !reads(then) || !reads(els) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// maxResends bounds the sends again of one held read in one round: one
// for each other member of a cluster of seven.
const maxResends = 6

// Rounds of sends again: the first after Stall, the others restall apart
// while no answer came. A member that answers does so in milliseconds, so
// a round unanswered for restall most likely reached the holding member
// too (see Hedge).
const (
	maxRounds = 4
	restall   = Stall / 4
)

// Hedge sends a read on cli, and if it is unanswered after Stall sends it
// again, once for each other endpoint of cli (up to maxResends), all at
// once; and again so every restall, up to maxRounds rounds, while none
// answered. The first answer that is not an error is taken, or else the
// last error. The sends still out are cancelled on return. Only for
// requests that change nothing.
//
// One send again is not enough: the balancer gives each request the next
// member in turn, and the requests sent by others in the meantime decide
// whose turn it is, so a single resend could reach the member that held
// the first (defect 112). Sends made together take turns next to each
// other, and so mostly go to different members; but other requests may
// come between them, and on a loaded machine every send of a round
// reached the holding member about once in 200 held reads (defect 129).
// Each further round is another such chance, and a read stays held only
// if every round's sends reached that member.
func Hedge[T any](ctx context.Context, cli *clientv3.Client, send func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		resp T
		err  error
	}
	answers := make(chan answer, 1+maxRounds*maxResends) // each send's goroutine ends once it has answered
	run := func() {
		resp, err := send(ctx)
		answers <- answer{resp, err}
	}
	go run()
	again := time.NewTimer(Stall)
	defer again.Stop()
	others := 0 // sends in a round, read at the first: Endpoints copies them
	for sent, answered, rounds := 1, 0, 0; ; {
		select {
		case <-again.C:
			if rounds == 0 {
				others = min(max(len(cli.Endpoints())-1, 1), maxResends)
			}
			sent += others
			for range others {
				go run()
			}
			if rounds++; rounds < maxRounds {
				again.Reset(restall)
			}
		case a := <-answers:
			// An error before Stall is the answer: nothing says another
			// send would fare better.
			if answered++; a.err == nil || answered == sent {
				return a.resp, a.err
			}
		}
	}
}

func resend[T any](call func() (T, error)) (resp T, err error) {
	for range Attempts {
		if resp, err = call(); !Refused(err) {
			break
		}
	}
	return resp, err
}

// Refused reports whether err is a member's refusal of a request for
// having no leader, which ran nothing.
func Refused(err error) bool {
	return err != nil && errors.Is(rpctypes.Error(err), rpctypes.ErrNoLeader)
}
