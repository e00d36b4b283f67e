package sequencer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/etcdkv"
	"github.com/fenced/fenced/internal/groupcommit"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sequencer issues fencing tokens. Next returns a token for the lock name
// that is greater than every token returned for that name by a call that
// completed before this one began. A retried call takes a new token; the
// lease store records the one token a lease uses (docs/design.md, step 4).
type Sequencer interface {
	Next(ctx context.Context, name string) (fence.Token, error)
}

// ErrClosed is returned by calls on a closed sequencer.
var ErrClosed = errors.New("sequencer: closed")

// DefaultPrefix is where tokens live in etcd unless WithPrefix says otherwise.
const DefaultPrefix = "/fenced/"

// Etcd is a Sequencer on etcd revisions with group commit.
type Etcd struct {
	cli           *clientv3.Client
	ks            Keyspace
	issuer        *Issuer
	log           *slog.Logger
	maxBatch      int
	inflight      int
	commitTimeout time.Duration

	gc       groupcommit.Committer[struct{}]
	unfollow func() // stops the issuer's watch of the counter key

	mu      sync.Mutex
	closed  bool
	commits sync.WaitGroup // transactions in flight

	txns, grants atomic.Uint64
}

var _ Sequencer = (*Etcd)(nil)

// Option configures an Etcd sequencer.
type Option func(*Etcd) error

// WithPrefix sets the etcd key prefix. Default DefaultPrefix ("/fenced/").
func WithPrefix(p string) Option {
	return func(s *Etcd) error {
		if p == "" {
			return errors.New("sequencer: empty key prefix")
		}
		s.ks = NewKeyspace(p)
		return nil
	}
}

// WithMaxBatch sets how many names one transaction may carry. Default
// 1024; allowed 1 to 100000. A batch is one Put whatever its size, so it
// never nears etcd's --max-txn-ops; the bound only caps the callers one
// reply answers.
func WithMaxBatch(n int) Option {
	return func(s *Etcd) error {
		if n < 1 || n > 100000 {
			return fmt.Errorf("sequencer: max batch %d: want 1 to 100000", n)
		}
		s.maxBatch = n
		return nil
	}
}

// WithLogger sets where the sequencer warns that etcd went back in time
// (see Issuer). Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *Etcd) error {
		if l == nil {
			return errors.New("sequencer: nil logger")
		}
		s.log = l
		return nil
	}
}

// WithInflight sets how many transactions may be in flight at once. Default
// 1; allowed 1 to 64. More in flight means smaller batches: on a local etcd
// with 64 callers, one in flight carried 32 grants per Txn and four in
// flight 9, for the same grants per second (BenchmarkNext, about 27,000/s on
// two cores) and more Txns to apply. Raise it when the round trip to a
// distant etcd, not etcd's apply, is the bottleneck.
func WithInflight(n int) Option {
	return func(s *Etcd) error {
		if n < 1 || n > 64 {
			return fmt.Errorf("sequencer: inflight %d: want 1 to 64", n)
		}
		s.inflight = n
		return nil
	}
}

// WithCommitTimeout bounds one transaction. Default 5s. A batch is shared by
// many callers, so it is not bound to any one caller's context.
func WithCommitTimeout(d time.Duration) Option {
	return func(s *Etcd) error {
		if d <= 0 {
			return fmt.Errorf("sequencer: commit timeout %s: want > 0", d)
		}
		s.commitTimeout = d
		return nil
	}
}

// NewEtcd returns a sequencer on cli. Close stops it; it does not close cli.
func NewEtcd(cli *clientv3.Client, opts ...Option) (*Etcd, error) {
	if cli == nil {
		return nil, errors.New("sequencer: nil etcd client")
	}
	s := &Etcd{
		cli:           cli,
		ks:            NewKeyspace(""),
		log:           slog.Default(),
		maxBatch:      1024,
		inflight:      1,
		commitTimeout: 5 * time.Second,
	}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	s.issuer = NewIssuer(cli, s.ks, s.log)
	s.unfollow = s.issuer.Follow()
	s.gc.Commit, s.gc.Slots, s.gc.Inline, s.gc.Stall = s.commit, s.inflight, true, etcdkv.Stall
	s.gc.SetMaxBatch(s.maxBatch)
	return s, nil
}

// Ping checks that etcd can issue tokens (Issuer.Ping): etcd takes
// writes, and a token is left below 2^63 (else ErrTokensExhausted).
func (s *Etcd) Ping(ctx context.Context) error {
	if err := s.issuer.Ping(ctx); err != nil {
		return fmt.Errorf("sequencer: etcd: %w", err)
	}
	return nil
}

// PingEtcd checks that etcd can take writes, without making one: it
// answers a linearizable read of key (a leader, a quorum), and no alarm is
// raised. An alarm is what stops an etcd that answers reads from taking
// writes: NOSPACE (its database reached its space quota; the error
// matches rpctypes.ErrNoSpace), CORRUPT. The alarms are read from the
// Status of the member that answers (every member applies them through
// Raft), which gives them only as text: AlarmList gives them typed but is
// itself a Raft request, a log entry for every probe.
func PingEtcd(ctx context.Context, cli *clientv3.Client, key string) error {
	// Through etcdkv: hedged, and a member without a leader is reported
	// as such, not as a timeout (defect 109).
	if _, err := etcdkv.New(cli).Get(clientv3.WithRequireLeader(ctx), key, clientv3.WithCountOnly()); err != nil {
		return err
	}
	return alarms(ctx, cli)
}

// alarms returns an error for an alarm raised that stops writes, as read
// from the Status of the member that answers (see PingEtcd).
func alarms(ctx context.Context, cli *clientv3.Client) error {
	st, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return err
	}
	for _, e := range st.Errors {
		switch {
		case strings.Contains(e, pb.AlarmType_NOSPACE.String()):
			return fmt.Errorf("%w: alarm raised (%s)", rpctypes.ErrNoSpace, strings.Join(strings.Fields(e), " "))
		case strings.Contains(e, pb.AlarmType_CORRUPT.String()):
			return fmt.Errorf("%w: alarm raised (%s)", rpctypes.ErrCorrupt, strings.Join(strings.Fields(e), " "))
		}
	}
	return nil
}

// Stats counts what the sequencer did.
type Stats struct {
	Txns   uint64 // transactions committed
	Grants uint64 // tokens returned by those transactions
}

// Stats returns counters since NewEtcd.
func (s *Etcd) Stats() Stats { return Stats{Txns: s.txns.Load(), Grants: s.grants.Load()} }

// Next implements Sequencer. Concurrent calls are group-committed (package
// internal/groupcommit): a call that finds a transaction slot free starts
// the slot's runner, which sends everything pending, batch after batch,
// until nothing is; each caller waits for its transaction, or until its
// context ends.
func (s *Etcd) Next(ctx context.Context, name string) (fence.Token, error) {
	if name == "" {
		return 0, errors.New("sequencer: empty lock name")
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, ErrClosed
	}
	s.commits.Add(1)
	s.mu.Unlock()
	defer s.commits.Done()
	v, err := s.gc.Do(ctx, name, struct{}{})
	if err != nil && ctx.Err() == nil && s.isClosed() {
		// Close ended it: queued (groupcommit.ErrClosed), or its Txn in
		// flight (cancelled).
		return 0, ErrClosed
	}
	if err != nil {
		// A batch it was in may still commit; the token is then never used.
		return 0, err
	}
	return v.(fence.Token), nil
}

// isClosed reports whether Close was called.
func (s *Etcd) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close makes later calls, and those still waiting for their Txn, fail
// with ErrClosed, and returns once they have. It is safe to call more than
// once.
func (s *Etcd) Close() error {
	s.mu.Lock()
	closed := s.closed
	s.closed = true
	s.mu.Unlock()
	// Ended first: the calls pending fail now, with the batches in flight
	// and those whose callers all left (defect 170). Waited for after, a
	// hung etcd made Close commit the pending ones batch after batch, each
	// up to the commit timeout (defect 186).
	s.gc.Close()
	s.commits.Wait()
	if !closed {
		s.unfollow()
	}
	return nil
}

// commit takes one token for every name of the batch with one Txn: a Put
// of the counter key, whose revision (plus the floor offset) is the token.
// No key is written per name, so etcd's state does not grow with the names
// ever used, and the Txn has one operation whatever the batch's size.
func (s *Etcd) commit(batch []*groupcommit.Request[struct{}]) {
	ctx, cancel := groupcommit.Context(batch, s.commitTimeout)
	defer cancel()
	var (
		tok fence.Token
		err error
	)
	for range 3 { // a restore detected costs one more Txn
		if _, tok, _, err = s.issuer.Issue(ctx, nil, func(offset uint64) []clientv3.Op { return []clientv3.Op{s.ks.CounterPut(offset)} }, nil); !errors.Is(err, ErrRestored) {
			break
		}
	}
	if err != nil {
		err = fmt.Errorf("sequencer: etcd txn: %w", err)
	} else {
		s.txns.Add(1)
		s.grants.Add(uint64(len(batch)))
	}
	for _, r := range batch {
		r.Done(tok, err)
	}
}

// Token turns an etcd revision and the floor offset it was issued under
// into a fencing token.
func Token(rev int64, offset uint64) fence.Token { return fence.Token(uint64(rev) + offset) }
