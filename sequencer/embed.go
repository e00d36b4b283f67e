package sequencer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fenced/fenced/internal/freeport"
	"github.com/fenced/fenced/internal/redact"
)

// EmbedConfig configures an embedded etcd member. The zero value is a
// single-member cluster in a temporary directory on free loopback ports.
type EmbedConfig struct {
	// Dir is the data directory. Empty means a new temporary directory that
	// Close removes; one left by a process killed before Close is removed
	// by the next member started so.
	Dir string
	// Name is the member name. Default "fenced".
	Name string
	// ClientURL and PeerURL are what the member advertises: where clients
	// and the other members reach it. Empty means
	// http://127.0.0.1:<free port>.
	ClientURL, PeerURL string
	// ListenClientURL and ListenPeerURL are where the member listens, when
	// that is not the URL it is reached at: http://0.0.0.0:2380 in a
	// container the others reach as http://fenced-1:2380, or behind a
	// proxy. etcd binds IP addresses only (and localhost). Empty means
	// ClientURL and PeerURL.
	ListenClientURL, ListenPeerURL string
	// InitialCluster lists every member as name=peerURL,name=peerURL. Empty
	// means a single-member cluster of this member.
	InitialCluster string
	// ClusterToken is the initial cluster token. Default "fenced".
	ClusterToken string
	// JoinExisting starts the member with initial-cluster-state=existing
	// (a member added to a running cluster). Default false (new).
	JoinExisting bool
	// TickMs and ElectionMs are the Raft heartbeat interval and election
	// timeout. Defaults 100 and 1000, etcd's own.
	TickMs, ElectionMs uint
	// LogLevel is etcd's log level. Default "error": etcd is verbose.
	LogLevel string
	// UnsafeNoFsync turns fsync off. Only for tests and benchmarks: a
	// machine crash can then lose revisions and so reissue tokens.
	UnsafeNoFsync bool
	// StartTimeout bounds how long Start waits for the member to join a
	// cluster with a leader. Default 30s.
	StartTimeout time.Duration
	// CompactionRetention is how much of etcd's history the member keeps;
	// older history is compacted, checked every tenth of it. Default
	// DefaultCompactionRetention; negative is refused.
	CompactionRetention time.Duration
	// Log, if set, gets etcd's own log lines (LogLevel and above, with
	// component=etcd), so that they keep its handler's format and
	// destination, and a warning every few seconds while the member waits
	// for the rest of its cluster, naming the members it waits for. nil
	// means etcd's lines go to stderr as zap JSON.
	Log *slog.Logger
}

// DefaultCompactionRetention is the history an embedded member keeps. Each
// acquire and release on etcd leases leaves about 200 bytes of history,
// and history counts against etcd's space quota (2 GiB) until it is
// compacted; past the quota etcd refuses every write. An hour, the
// retention before, filled the quota at a sustained 2,600 pairs a second;
// a minute holds 1 GiB only past 78,000 (docs/design.md, "Bounded state").
// Nothing of fenced reads history older than a few seconds: its watches
// start from now, and the issuer's survives a compaction.
const DefaultCompactionRetention = time.Minute

// Embedded is a running embedded etcd member.
type Embedded struct {
	etcd      *embed.Etcd
	dir       string
	tempDir   bool
	tempLock  *os.File      // held while the member runs (see tempDataDir)
	startDone chan struct{} // closed when etcd's start has returned: see startEtcd
	clientURL string
	localURL  string // where this process reaches it: see LocalClientURL
	peerURL   string
	listenOn  string // peers' listen URL: see ListenPeerURL
	name      string

	closing   atomic.Bool // etcd logs its listeners' closing as errors; Close silences those
	closeOnce sync.Once
	closeErr  error
}

// StartEmbedded starts an etcd member and waits until it is ready to serve,
// which for a multi-member cluster means a quorum of members has started.
// Members of one cluster must therefore be started concurrently. When it
// picks the ports itself (no ClientURL or PeerURL) and another process takes
// one before etcd binds it, it tries again with new ports, up to 3 times.
// A member that does not start (StartTimeout, ctx, an error) is stopped and
// its ports freed before the error returns.
func StartEmbedded(ctx context.Context, c EmbedConfig) (*Embedded, error) {
	auto := c.ClientURL == "" || c.PeerURL == ""
	for attempt := 1; ; attempt++ {
		e, err := startEmbedded(ctx, c)
		// A bind fails before etcd writes anything to the data dir, so the
		// same dir can be used again.
		if err == nil || !auto || attempt == 3 || ctx.Err() != nil || !strings.Contains(err.Error(), "address already in use") {
			return e, err
		}
	}
}

func startEmbedded(ctx context.Context, c EmbedConfig) (*Embedded, error) {
	if c.Name == "" {
		c.Name = "fenced"
	}
	if c.ClusterToken == "" {
		c.ClusterToken = "fenced"
	}
	if c.LogLevel == "" {
		c.LogLevel = "error"
	}
	switch {
	case c.CompactionRetention < 0:
		return nil, fmt.Errorf("sequencer: compaction retention %s: want > 0 (0 means %s)", c.CompactionRetention, DefaultCompactionRetention)
	case c.CompactionRetention == 0:
		c.CompactionRetention = DefaultCompactionRetention
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 30 * time.Second
	}
	switch {
	case c.ListenClientURL != "" && c.ClientURL == "":
		return nil, fmt.Errorf("sequencer: listen client URL %s without a client URL: want the URL clients reach the member at too", c.ListenClientURL)
	case c.ListenPeerURL != "" && c.PeerURL == "":
		return nil, fmt.Errorf("sequencer: listen peer URL %s without a peer URL: want the URL the other members reach it at too", c.ListenPeerURL)
	}
	// etcd takes any scheme, and serves plain HTTP on it, where no client
	// reaches it (docs/design.md, defect 141).
	for _, u := range []struct{ what, url string }{
		{"client URL", c.ClientURL}, {"peer URL", c.PeerURL}, {"listen client URL", c.ListenClientURL}, {"listen peer URL", c.ListenPeerURL},
	} {
		if u.url == "" {
			continue
		}
		if p, err := url.Parse(u.url); err != nil || p.Scheme != "http" || p.Port() == "" {
			return nil, fmt.Errorf("sequencer: %s %q: want http://host:port: the embedded member serves plain HTTP", u.what, u.url)
		}
	}
	var err error
	if c.ClientURL == "" {
		if c.ClientURL, err = freeLoopbackURL(); err != nil {
			return nil, err
		}
	}
	if c.PeerURL == "" {
		if c.PeerURL, err = freeLoopbackURL(); err != nil {
			return nil, err
		}
	}
	if c.InitialCluster == "" {
		c.InitialCluster = c.Name + "=" + c.PeerURL
	}
	e := &Embedded{dir: c.Dir, clientURL: c.ClientURL, peerURL: c.PeerURL, name: c.Name, startDone: make(chan struct{})}
	if e.dir == "" {
		if e.dir, e.tempLock, err = tempDataDir(); err != nil {
			return nil, fmt.Errorf("sequencer: temporary data dir: %w", err)
		}
		e.tempDir = true
	}

	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = e.dir
	lvl, err := zapcore.ParseLevel(c.LogLevel)
	if err != nil {
		return nil, e.failStart(fmt.Errorf("sequencer: log level %q: want debug, info, warn or error", c.LogLevel))
	}
	var lg *zap.Logger
	if c.Log != nil {
		lg = zap.New(&quietClose{Core: &slogCore{log: c.Log, level: lvl}, closing: &e.closing}, zap.AddCaller())
	} else {
		zc := zap.NewProductionConfig()
		zc.Level = zap.NewAtomicLevelAt(lvl)
		lg, err = zc.Build(zap.WrapCore(func(core zapcore.Core) zapcore.Core { return &quietClose{Core: core, closing: &e.closing} }))
		if err != nil {
			return nil, e.failStart(fmt.Errorf("sequencer: etcd logger: %w", err))
		}
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	cfg.LogLevel = c.LogLevel
	cfg.InitialCluster = c.InitialCluster
	cfg.InitialClusterToken = c.ClusterToken
	cfg.UnsafeNoFsync = c.UnsafeNoFsync
	// Every grant is a revision; without compaction the history grows
	// until etcd's quota stops all writes. Compaction keeps the revision
	// counter, so tokens are unaffected.
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = c.CompactionRetention.String()
	if c.JoinExisting {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	if c.TickMs > 0 {
		cfg.TickMs = c.TickMs
	}
	if c.ElectionMs > 0 {
		cfg.ElectionMs = c.ElectionMs
	}
	for _, u := range []struct {
		what                string
		advertised, listen  string
		advertises, listens *[]url.URL
	}{
		{"client", c.ClientURL, c.ListenClientURL, &cfg.AdvertiseClientUrls, &cfg.ListenClientUrls},
		{"peer", c.PeerURL, c.ListenPeerURL, &cfg.AdvertisePeerUrls, &cfg.ListenPeerUrls},
	} {
		at, err := url.Parse(u.advertised)
		if err != nil {
			return nil, e.failStart(fmt.Errorf("sequencer: %s URL %q: %w", u.what, u.advertised, err))
		}
		on := at
		if u.listen != "" {
			if on, err = url.Parse(u.listen); err != nil {
				return nil, e.failStart(fmt.Errorf("sequencer: listen %s URL %q: %w", u.what, u.listen, err))
			}
		}
		*u.advertises, *u.listens = []url.URL{*at}, []url.URL{*on}
	}
	e.localURL = localURL(cfg.ListenClientUrls[0])
	e.listenOn = cfg.ListenPeerUrls[0].String()

	// etcd waits without limit, silently, for the lock of a data dir
	// another process runs on (docs/design.md, defect 140): refuse that at
	// once.
	if !e.tempDir {
		if err := checkDataDirFree(e.dir); err != nil {
			return nil, e.failStart(err)
		}
	}
	if abandoned, err := e.startEtcd(ctx, cfg, embed.StartEtcd, c.Log); abandoned {
		return nil, err
	} else if err != nil {
		return nil, e.failStart(err)
	}
	timer := time.NewTimer(c.StartTimeout)
	defer timer.Stop()
	// A member of several waits for a quorum of them, silently: say so,
	// or an operator sees a node that neither starts nor fails.
	waiting := time.NewTicker(startWaitLog)
	defer waiting.Stop()
	began := time.Now()
	for {
		select {
		case <-e.etcd.Server.ReadyNotify():
			return e, nil
		case err := <-e.etcd.Err():
			return nil, e.failStart(fmt.Errorf("sequencer: embedded etcd failed: %w", err))
		case <-timer.C:
			return nil, e.failStart(fmt.Errorf("sequencer: embedded etcd %q not ready after %s: are the other members of %s running?", c.Name, c.StartTimeout, c.InitialCluster))
		case <-ctx.Done():
			return nil, e.failStart(fmt.Errorf("sequencer: start embedded etcd: %w", ctx.Err()))
		case <-waiting.C:
			if c.Log != nil {
				c.Log.Warn("embedded etcd member waits for a quorum of its cluster", "name", c.Name,
					"initial_cluster", c.InitialCluster, "waited", time.Since(began).Round(time.Second), "gives_up_after", c.StartTimeout,
					"hint", "start the other members (a majority must run), and check that their peer URLs are reachable from here")
			}
		}
	}
}

// startWaitLog is how often StartEmbedded says it still waits for its
// cluster.
const startWaitLog = 5 * time.Second

// startEtcd runs start (embed.StartEtcd) until it returns or ctx ends.
// etcd cannot be cancelled while it opens its data, and waits there
// without limit for a lock that another process took after
// checkDataDirFree looked (defect 140). So on ctx's end it is left to
// finish, abandoned is true, and the member is closed (its temporary dir
// removed) once it has: the caller must not close it. startDone is closed
// then.
func (e *Embedded) startEtcd(ctx context.Context, cfg *embed.Config, start func(*embed.Config) (*embed.Etcd, error), log *slog.Logger) (abandoned bool, err error) {
	type started struct {
		etcd *embed.Etcd
		err  error
	}
	done := make(chan started, 1)
	go func() { // ends when etcd's start does, which ctx cannot hasten
		etcd, err := start(cfg) // on an error, etcd is nil: StartEtcd closed it
		done <- started{etcd, err}
	}()
	waiting := time.NewTicker(startWaitLog)
	defer waiting.Stop()
	began := time.Now()
	for {
		select {
		case s := <-done:
			close(e.startDone)
			if s.err != nil {
				return false, fmt.Errorf("sequencer: start embedded etcd in %s: %w", e.dir, s.err)
			}
			e.etcd = s.etcd
			return false, nil
		case <-ctx.Done():
			go func() { // owned by nobody: see above
				defer close(e.startDone)
				s := <-done
				e.etcd = s.etcd
				if e.etcd != nil {
					e.closing.Store(true)
					e.etcd.Server.HardStop() // see failStart
				}
				_ = e.Close()
			}()
			err := fmt.Errorf("sequencer: start embedded etcd in %s: %w while etcd was still opening its data", e.dir, ctx.Err())
			if !e.tempDir { // a new temporary dir is nobody else's
				err = fmt.Errorf("%w, which it waits for without limit while another process holds %s: is a fenced or etcd running on that dir?", err, filepath.Join(e.dir, "member", "snap", "db"))
			}
			return true, err
		case <-waiting.C:
			if log != nil {
				log.Warn("embedded etcd still opens its data dir", "data_dir", e.dir, "waited", time.Since(began).Round(time.Second),
					"hint", "etcd waits without limit while another process holds the lock of member/snap/db: stop any fenced or etcd running on this dir")
			}
		}
	}
}

// failStart closes a member that did not start, and returns err. etcd's
// Close waits for the member to serve clients, which a member that never
// had a quorum never did, unless its server is stopping: so the server is
// stopped first, or the member runs on, its ports bound (defect 88). The
// close is still waited for only so long, then left to finish or not as
// the process exits.
func (e *Embedded) failStart(err error) error {
	closed := make(chan error, 1)
	go func() { // owned by nobody once abandoned: see above
		if e.etcd != nil && e.etcd.Server != nil {
			e.closing.Store(true) // the stop fails etcd's serving, which it logs as an error
			e.etcd.Server.HardStop()
		}
		closed <- e.Close()
	}()
	select {
	case cerr := <-closed:
		if cerr != nil {
			err = errors.Join(err, cerr)
		}
	case <-time.After(failCloseWait):
		err = fmt.Errorf("%w (its close did not end within %s; exit the process to free its ports)", err, failCloseWait)
	}
	return err
}

// failCloseWait bounds failStart's wait for etcd's Close.
const failCloseWait = 3 * time.Second

// ClientURL is the URL clients connect to.
func (e *Embedded) ClientURL() string { return e.clientURL }

// LocalClientURL is where this process reaches the member: where it
// listens for clients, 0.0.0.0 or :: taken as loopback. A URL it is
// reached at from elsewhere (a container's name, a NAT) may not lead
// back to this host from this host.
func (e *Embedded) LocalClientURL() string { return e.localURL }

func localURL(u url.URL) string {
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
		loop := "127.0.0.1"
		if ip.To4() == nil {
			loop = "::1"
		}
		u.Host = net.JoinHostPort(loop, u.Port())
	}
	return u.String()
}

// PeerURL is the URL other members connect to.
func (e *Embedded) PeerURL() string { return e.peerURL }

// ListenPeerURL is where the member listens for the other members:
// EmbedConfig.ListenPeerURL, or PeerURL. A restart on the same data dir
// needs both.
func (e *Embedded) ListenPeerURL() string { return e.listenOn }

// Name is the member name.
func (e *Embedded) Name() string { return e.name }

// Dir is the data directory.
func (e *Embedded) Dir() string { return e.dir }

// Err reports a fatal error of the running member.
func (e *Embedded) Err() <-chan error { return e.etcd.Err() }

// ID is the member's id as etcd writes it, in hex: in its log, in
// `etcdctl member list`, and in the X-Server-From header of what it sends
// its peers.
func (e *Embedded) ID() string { return e.etcd.Server.MemberID().String() }

// IsLeader reports whether this member is the Raft leader now.
func (e *Embedded) IsLeader() bool {
	return e.etcd.Server.Leader() == e.etcd.Server.MemberID()
}

// Client returns a new etcd client of this member. The caller closes it.
func (e *Embedded) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{e.localURL},
		DialTimeout: 5 * time.Second,
		Logger:      quietLogger(),
	})
}

// Close stops the member and, if its data dir was temporary, removes it.
// It is safe to call more than once.
func (e *Embedded) Close() error {
	e.closeOnce.Do(func() {
		if e.etcd != nil {
			e.closing.Store(true)
			e.etcd.Close()
		}
		if e.tempDir {
			e.closeErr = os.RemoveAll(e.dir)
			e.tempLock.Close() // after the removal: no sweep meets a half-removed dir
		}
	})
	return e.closeErr
}

// quietClose drops the errors etcd logs when its own listeners close during
// Close ("setting up serving from embedded etcd failed": "mux: server
// closed", "use of closed network connection"): a clean shutdown is not an
// error, and operators should not learn to ignore error lines.
type quietClose struct {
	zapcore.Core
	closing *atomic.Bool
}

func (q *quietClose) With(f []zapcore.Field) zapcore.Core {
	return &quietClose{Core: q.Core.With(f), closing: q.closing}
}

func (q *quietClose) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.closing.Load() && ent.Message == "setting up serving from embedded etcd failed." {
		return ce
	}
	return q.Core.Check(ent, ce)
}

// slogCore writes etcd's log entries to a slog.Logger, with
// component=etcd and etcd's caller: etcd logs through zap, and its own
// encoders wrote JSON in the middle of a text log. Stack traces are left
// out, as slog has none.
type slogCore struct {
	log   *slog.Logger
	level zapcore.Level // EmbedConfig.LogLevel
	attrs []slog.Attr   // of With
}

var _ zapcore.Core = (*slogCore)(nil)

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return l >= c.level && c.log.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, level: c.level, attrs: append(slices.Clip(c.attrs), slogAttrs(fields)...)}
}

func (c *slogCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *slogCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(ent.Time, slogLevel(ent.Level), ent.Message, 0)
	r.AddAttrs(slog.String("component", "etcd"))
	if ent.Caller.Defined {
		r.AddAttrs(slog.String("caller", ent.Caller.TrimmedPath()))
	}
	r.AddAttrs(c.attrs...)
	r.AddAttrs(slogAttrs(fields)...)
	return c.log.Handler().Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

// slogLevel is the slog level of a zap level; zap's DPanic, Panic and
// Fatal are errors.
func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

// slogAttrs are zap fields as slog attributes, in their order (a field
// that adds several keys, as an error can, in the keys' order).
func slogAttrs(fields []zapcore.Field) []slog.Attr {
	attrs := make([]slog.Attr, 0, len(fields))
	for _, f := range fields {
		enc := zapcore.NewMapObjectEncoder()
		f.AddTo(enc)
		for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
			attrs = append(attrs, slog.Any(k, enc.Fields[k]))
		}
	}
	return attrs
}

// freeLoopbackURL returns http://127.0.0.1:port for a port that was free a
// moment ago, never the one it returned for another URL (package freeport:
// the client and peer URL could be the same port). Another process may take
// it before etcd binds it; StartEmbedded then fails with an address-in-use
// error and the caller may retry.
func freeLoopbackURL() (string, error) {
	u, err := freeport.URL()
	if err != nil {
		return "", fmt.Errorf("sequencer: %w", err)
	}
	return u, nil
}

// ParseEndpoints splits a comma-separated list of etcd endpoints and checks
// that each is an http:// or https:// URL, or host:port. Any other scheme
// (a typo such as htp://, or unix://) is refused: the etcd client takes
// it, then never connects, and its caller waits until its deadline, or
// for ever (docs/design.md, defect 141).
func ParseEndpoints(s string) ([]string, error) {
	var out []string
	for _, ep := range strings.Split(s, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		host, shown := ep, redact.URL(ep) // an error must not print a password
		if i := strings.Index(ep, "://"); i >= 0 {
			u, err := url.Parse(ep)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("sequencer: etcd endpoint %q is not a URL like http://host:2379", shown)
			}
			if u.Scheme != "http" && u.Scheme != "https" {
				return nil, fmt.Errorf("sequencer: etcd endpoint %q: scheme %s:// is neither http nor https: want http://host:port, https://host:port or host:port", shown, u.Scheme)
			}
			host = u.Host
			if u.User != nil {
				host = u.User.Username() + "@" + host
			}
		}
		// The etcd client would ignore a user and password here and
		// connect without them.
		if strings.Contains(host, "@") {
			return nil, fmt.Errorf("sequencer: etcd endpoint %q: want no user or password in it: etcd's are given apart (fenced: --etcd-username and --etcd-password)", shown)
		}
		if _, _, err := net.SplitHostPort(host); err != nil {
			return nil, fmt.Errorf("sequencer: etcd endpoint %q: want host:port or http(s)://host:port", shown)
		}
		out = append(out, ep)
	}
	if len(out) == 0 {
		return nil, errors.New("sequencer: no etcd endpoints given")
	}
	return out, nil
}
