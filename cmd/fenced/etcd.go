package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// etcdFlags configure a client of an external etcd cluster.
type etcdFlags struct {
	endpoints          string
	tlsFiles           tlsFiles
	username, password string
	dialTimeout        time.Duration
}

func (e *etcdFlags) register(fs *flag.FlagSet, endpointsHelp string) {
	e.tlsFiles.caFlag, e.tlsFiles.certFlag, e.tlsFiles.keyFlag = "--etcd-ca", "--etcd-cert", "--etcd-key"
	fs.StringVar(&e.endpoints, "etcd-endpoints", "", endpointsHelp)
	fs.StringVar(&e.tlsFiles.ca, "etcd-ca", "", "PEM CA `file` to verify the etcd servers' certificates (https endpoints).")
	fs.StringVar(&e.tlsFiles.cert, "etcd-cert", "", "PEM client certificate `file` for etcd (needs --etcd-key).")
	fs.StringVar(&e.tlsFiles.key, "etcd-key", "", "PEM private key `file` of --etcd-cert.")
	fs.StringVar(&e.username, "etcd-username", "", "etcd user name, when etcd has authentication on (needs --etcd-password).")
	fs.StringVar(&e.password, "etcd-password", "", "etcd password; prefer the environment variable to keep it out of ps.")
	fs.DurationVar(&e.dialTimeout, "etcd-dial-timeout", 5*time.Second, "How long to wait for the first connection to etcd.")
}

func registerPrefix(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "etcd-prefix", sequencer.DefaultPrefix, "etcd key `prefix` of tokens, leases and the token floor; the same for every fenced node and for admin commands.")
}

// externalFlagNames are the flags that only make sense with --etcd-endpoints.
var externalFlagNames = []string{"etcd-ca", "etcd-cert", "etcd-key", "etcd-username", "etcd-password", "etcd-dial-timeout"}

func (e *etcdFlags) validate(cmd string) ([]string, error) {
	eps, err := sequencer.ParseEndpoints(e.endpoints)
	if err != nil {
		return nil, usagef(cmd, "--etcd-endpoints %q: %v", e.endpoints, strings.TrimPrefix(err.Error(), "sequencer: "))
	}
	for _, ep := range eps {
		host := ep
		if u, err := url.Parse(ep); err == nil && strings.Contains(ep, "://") {
			host = u.Host
		}
		_, port, _ := net.SplitHostPort(host) // ParseEndpoints checked it
		if err := checkPort(port, 1); err != nil {
			return nil, usagef(cmd, "--etcd-endpoints %q: endpoint %q: %v", e.endpoints, ep, err)
		}
	}
	if err := e.tlsFiles.check(cmd); err != nil {
		return nil, err
	}
	if (e.username == "") != (e.password == "") {
		return nil, usagef(cmd, "--etcd-username and --etcd-password go together: give both or neither")
	}
	if e.dialTimeout <= 0 {
		return nil, usagef(cmd, "--etcd-dial-timeout %s: want > 0", e.dialTimeout)
	}
	return eps, nil
}

// client returns a client of the external cluster; the caller closes it.
// dial adds gRPC options (the daemon's metrics).
func (e *etcdFlags) client(eps []string, dial ...grpc.DialOption) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints: eps, DialTimeout: e.dialTimeout,
		Username: e.username, Password: e.password,
		Logger: zap.NewNop(), DialOptions: dial,
	}
	if e.tlsFiles.ca != "" || e.tlsFiles.cert != "" {
		tc, err := e.tlsFiles.client()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client of %s: %w", strings.Join(eps, ","), err)
	}
	return cli, nil
}

// embeddedClient returns a client of an embedded member, with gRPC
// options; the caller closes it.
func embeddedClient(e *sequencer.Embedded, dial ...grpc.DialOption) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{e.ClientURL()}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(), DialOptions: dial,
	})
	if err != nil {
		return nil, fmt.Errorf("client of the embedded etcd at %s: %w", e.ClientURL(), err)
	}
	return cli, nil
}

// embedFlags configure an embedded etcd member.
type embedFlags struct {
	name, dataDir       string
	peerURL, clientURL  string
	initialCluster      string
	state, token        string
	heartbeat, election time.Duration
	retention           time.Duration
	unsafeNoFsync       bool
}

func (m *embedFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.dataDir, "etcd-data-dir", "", "Run an embedded etcd member with its data in this `dir`, instead of --etcd-endpoints.\nThree fenced nodes with embedded members form one Raft cluster (see --etcd-initial-cluster).")
	fs.StringVar(&m.name, "etcd-name", "fenced", "Embedded member: its `name`, unique in the cluster.")
	fs.StringVar(&m.peerURL, "etcd-peer-url", "", "Embedded member: `URL` it listens on and advertises to the other members, http://host:port.\nEmpty: a free loopback port (single member only).")
	fs.StringVar(&m.clientURL, "etcd-client-url", "", "Embedded member: `URL` it serves etcd clients on, http://host:port. Empty: a free loopback port.")
	fs.StringVar(&m.initialCluster, "etcd-initial-cluster", "", "Embedded member: every member as `name=peerURL,...`, this one included. Empty: a single-member cluster.")
	fs.StringVar(&m.state, "etcd-initial-cluster-state", "new", "Embedded member: `state` new to form a new cluster, existing to join a running one (after etcdctl member add).")
	fs.StringVar(&m.token, "etcd-cluster-token", "fenced", "Embedded member: the initial cluster `token`, the same on every member.")
	fs.DurationVar(&m.heartbeat, "etcd-heartbeat-interval", 100*time.Millisecond, "Embedded member: Raft heartbeat interval.")
	fs.DurationVar(&m.election, "etcd-election-timeout", time.Second, "Embedded member: Raft election timeout, at least 5 heartbeats. etcd leases are at least 1.5 times this.")
	fs.DurationVar(&m.retention, "etcd-compaction-retention", sequencer.DefaultCompactionRetention, "Embedded member: how much history it keeps before compacting it. History counts against etcd's\n2 GiB quota, and etcd leases leave about 210 bytes an acquire+release: a minute of it reaches 1 GiB only past 78,000 pairs a second.")
	fs.BoolVar(&m.unsafeNoFsync, "etcd-unsafe-no-fsync", false, "Embedded member: do not fsync. Only for tests: a machine crash can then reissue tokens.")
}

// embedFlagNames are the flags that only make sense with --etcd-data-dir.
var embedFlagNames = []string{"etcd-name", "etcd-peer-url", "etcd-client-url", "etcd-initial-cluster",
	"etcd-initial-cluster-state", "etcd-cluster-token", "etcd-heartbeat-interval", "etcd-election-timeout", "etcd-compaction-retention", "etcd-unsafe-no-fsync"}

func (m *embedFlags) validate(cmd string) error {
	if m.name == "" || strings.ContainsAny(m.name, "=, ") {
		return usagef(cmd, "--etcd-name %q: want a non-empty name without '=', ',' or spaces", m.name)
	}
	for _, u := range []struct{ flag, v string }{{"etcd-peer-url", m.peerURL}, {"etcd-client-url", m.clientURL}} {
		if u.v == "" {
			continue
		}
		if err := checkMemberURL(u.v); err != nil {
			return usagef(cmd, "--%s %q: %v", u.flag, u.v, err)
		}
	}
	if !oneOf(m.state, "new", "existing") {
		return usagef(cmd, "--etcd-initial-cluster-state %q: want new or existing", m.state)
	}
	if m.token == "" {
		return usagef(cmd, "--etcd-cluster-token: want a non-empty token")
	}
	if m.heartbeat <= 0 || m.heartbeat%time.Millisecond != 0 {
		return usagef(cmd, "--etcd-heartbeat-interval %s: want whole milliseconds > 0", m.heartbeat)
	}
	if m.election%time.Millisecond != 0 || m.election < 5*m.heartbeat {
		return usagef(cmd, "--etcd-election-timeout %s: want whole milliseconds, at least 5 times --etcd-heartbeat-interval (%s)", m.election, m.heartbeat)
	}
	if m.retention <= 0 {
		return usagef(cmd, "--etcd-compaction-retention %s: want > 0, such as %s (the default) or 10m", m.retention, sequencer.DefaultCompactionRetention)
	}
	if m.initialCluster == "" {
		if m.state == "existing" {
			return usagef(cmd, "--etcd-initial-cluster-state existing needs --etcd-initial-cluster with the running members and this one")
		}
		return nil
	}
	members := map[string]string{}
	for _, part := range strings.Split(m.initialCluster, ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" {
			return usagef(cmd, "--etcd-initial-cluster %q: entry %q: want name=http://host:port", m.initialCluster, part)
		}
		if err := checkMemberURL(u); err != nil {
			return usagef(cmd, "--etcd-initial-cluster %q: member %s: %v", m.initialCluster, name, err)
		}
		if _, dup := members[name]; dup {
			return usagef(cmd, "--etcd-initial-cluster %q: member %s appears twice", m.initialCluster, name)
		}
		members[name] = u
	}
	own, ok := members[m.name]
	switch {
	case !ok:
		return usagef(cmd, "--etcd-initial-cluster %q does not list this member, --etcd-name %q", m.initialCluster, m.name)
	case m.peerURL == "":
		return usagef(cmd, "--etcd-peer-url is required with --etcd-initial-cluster: the other members must reach this one")
	case own != m.peerURL:
		return usagef(cmd, "--etcd-initial-cluster lists %s=%s but --etcd-peer-url is %s: they must be the same", m.name, own, m.peerURL)
	}
	return nil
}

// checkMemberURL accepts http://host:port: the embedded member serves
// neither TLS nor a path.
func checkMemberURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" {
		return errors.New("want http://host:port (the embedded member serves plain HTTP: keep it on a private network)")
	}
	_, port, err := net.SplitHostPort(u.Host)
	if err != nil || port == "" || (u.Path != "" && u.Path != "/") {
		return errors.New("want http://host:port with a port and no path")
	}
	return checkPort(port, 1)
}

// start starts the member. With ports left to pick, a port taken between
// picking and binding is retried.
func (m *embedFlags) start(ctx context.Context, log *slog.Logger) (*sequencer.Embedded, error) {
	cfg := sequencer.EmbedConfig{
		Dir: m.dataDir, Name: m.name, PeerURL: m.peerURL, ClientURL: m.clientURL,
		InitialCluster: m.initialCluster, ClusterToken: m.token, JoinExisting: m.state == "existing",
		TickMs: uint(m.heartbeat / time.Millisecond), ElectionMs: uint(m.election / time.Millisecond),
		CompactionRetention: m.retention, UnsafeNoFsync: m.unsafeNoFsync, Log: log,
	}
	if m.dataDir != "" {
		if err := os.MkdirAll(m.dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("etcd data dir: %w", err)
		}
	}
	e, err := sequencer.StartEmbedded(ctx, cfg) // it retries ports it picked itself
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("--etcd-client-url %q or --etcd-peer-url %q: the address is in use (another etcd or fenced?): stop that process, pick another port, or leave the flag empty for a free one: %w", m.clientURL, m.peerURL, err)
	}
	if err != nil {
		return nil, err
	}
	log.Info("embedded etcd member ready", "name", e.Name(), "client_url", e.ClientURL(), "peer_url", e.PeerURL(), "data_dir", e.Dir())
	return e, nil
}
