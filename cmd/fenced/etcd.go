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
		// The error names the endpoint, with its password hidden.
		return nil, usagef(cmd, "--etcd-endpoints: %v", strings.TrimPrefix(err.Error(), "sequencer: "))
	}
	for _, ep := range eps {
		host := ep
		if u, err := url.Parse(ep); err == nil && strings.Contains(ep, "://") {
			host = u.Host
		}
		_, port, _ := net.SplitHostPort(host) // ParseEndpoints checked it
		if err := checkPort(port, 1); err != nil {
			return nil, usagef(cmd, "--etcd-endpoints: endpoint %q: %v", ep, err)
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
		Endpoints: []string{e.LocalClientURL()}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(), DialOptions: dial,
	})
	if err != nil {
		return nil, fmt.Errorf("client of the embedded etcd at %s: %w", e.LocalClientURL(), err)
	}
	return cli, nil
}

// embedFlags configure an embedded etcd member.
type embedFlags struct {
	name, dataDir       string
	peerURL, clientURL  string
	listenPeerURL       string
	listenClientURL     string
	initialCluster      string
	state, token        string
	heartbeat, election time.Duration
	retention           time.Duration
	unsafeNoFsync       bool
	// dirFlag is the flag of dataDir, for messages: --etcd-data-dir of
	// serve (register), or --data-dir of dev, which registers its own.
	dirFlag string
}

func (m *embedFlags) register(fs *flag.FlagSet) {
	m.dirFlag = "--etcd-data-dir"
	fs.StringVar(&m.dataDir, "etcd-data-dir", "", "Run an embedded etcd member with its data in this `dir`, instead of --etcd-endpoints; one process at a time.\nThree fenced nodes with embedded members form one Raft cluster (see --etcd-initial-cluster).")
	fs.StringVar(&m.name, "etcd-name", "fenced", "Embedded member: its `name`, unique in the cluster.")
	fs.StringVar(&m.peerURL, "etcd-peer-url", "", "Embedded member: `URL` the other members reach it at, http://host:port; it listens there too unless\n--etcd-listen-peer-url says otherwise. Empty: a free loopback port (single member only).")
	fs.StringVar(&m.clientURL, "etcd-client-url", "", "Embedded member: `URL` etcd clients reach it at, http://host:port; it listens there too unless\n--etcd-listen-client-url says otherwise. Empty: a free loopback port.")
	fs.StringVar(&m.listenPeerURL, "etcd-listen-peer-url", "", "Embedded member: `URL` it listens on for the other members, when that is not --etcd-peer-url:\nhttp://0.0.0.0:2380 in a container the others reach by name. An IP address or localhost. Empty: --etcd-peer-url.")
	fs.StringVar(&m.listenClientURL, "etcd-listen-client-url", "", "Embedded member: `URL` it listens on for etcd clients, when that is not --etcd-client-url.\nAn IP address or localhost. Empty: --etcd-client-url.")
	fs.StringVar(&m.initialCluster, "etcd-initial-cluster", "", "Embedded member: every member as `name=peerURL,...`, this one included. Empty: a single-member cluster.")
	fs.StringVar(&m.state, "etcd-initial-cluster-state", "new", "Embedded member: `state` new to form a new cluster, existing to join a running one (after etcdctl member add).")
	fs.StringVar(&m.token, "etcd-cluster-token", "fenced", "Embedded member: the initial cluster `token`, the same on every member.")
	fs.DurationVar(&m.heartbeat, "etcd-heartbeat-interval", 100*time.Millisecond, "Embedded member: Raft heartbeat interval.")
	fs.DurationVar(&m.election, "etcd-election-timeout", time.Second, "Embedded member: Raft election timeout, at least 5 heartbeats. etcd leases are at least 1.5 times this.")
	fs.DurationVar(&m.retention, "etcd-compaction-retention", sequencer.DefaultCompactionRetention, "Embedded member: how much history it keeps before compacting it. History counts against etcd's\n2 GiB quota, and etcd leases leave about 210 bytes an acquire+release: a minute of it reaches 1 GiB only past 78,000 pairs a second.")
	fs.BoolVar(&m.unsafeNoFsync, "etcd-unsafe-no-fsync", false, "Embedded member: do not fsync. Only for tests: a machine crash can then reissue tokens.")
}

// embedFlagNames are the flags that only make sense with --etcd-data-dir.
var embedFlagNames = []string{"etcd-name", "etcd-peer-url", "etcd-client-url", "etcd-listen-peer-url", "etcd-listen-client-url", "etcd-initial-cluster",
	"etcd-initial-cluster-state", "etcd-cluster-token", "etcd-heartbeat-interval", "etcd-election-timeout", "etcd-compaction-retention", "etcd-unsafe-no-fsync"}

func (m *embedFlags) validate(cmd string) error {
	if m.name == "" || strings.ContainsAny(m.name, "=, ") {
		return usagef(cmd, "--etcd-name %q: want a non-empty name without '=', ',' or spaces", m.name)
	}
	for _, u := range []struct{ what, at, on string }{{"peer", m.peerURL, m.listenPeerURL}, {"client", m.clientURL, m.listenClientURL}} {
		if err := checkListen(u.what, u.at, u.on); err != nil {
			return usagef(cmd, "%v", err)
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
	for name, u := range members {
		if h, _ := memberHost(u); unspecified(h) && len(members) > 1 {
			return usagef(cmd, "--etcd-initial-cluster %q: member %s at %s: the other members cannot reach %s: give the member's host name or IP (and, on that member, --etcd-listen-peer-url %s to listen on every interface)", m.initialCluster, name, u, h, u)
		}
	}
	return nil
}

// checkListen checks the URL the member is reached at (--etcd-peer-url or
// --etcd-client-url, what "peer" or "client") and the one it listens on,
// if any. etcd binds IP addresses only, so a host name needs a listen URL,
// and 0.0.0.0 is for listening, not for being reached at.
func checkListen(what, at, on string) error {
	flag, listen := "--etcd-"+what+"-url", "--etcd-listen-"+what+"-url"
	if at == "" {
		if on != "" {
			return fmt.Errorf("%s needs %s: the URL this member is reached at", listen, flag)
		}
		return nil
	}
	host, err := memberHost(at)
	if err != nil {
		return fmt.Errorf("%s %q: %v", flag, at, err)
	}
	if on == "" {
		if !bindable(host) {
			return fmt.Errorf("%s %q: etcd listens on IP addresses only: keep the name here, where this member is reached, and give %s http://0.0.0.0:PORT (or this host's IP) to listen on", flag, at, listen)
		}
		return nil
	}
	if unspecified(host) {
		return fmt.Errorf("%s %q: nothing reaches %s: give this host's name or IP here, and %s %s to listen on every interface", flag, at, host, listen, on)
	}
	onHost, err := memberHost(on)
	if err != nil {
		return fmt.Errorf("%s %q: %v", listen, on, err)
	}
	if !bindable(onHost) {
		return fmt.Errorf("%s %q: want an IP address (0.0.0.0 for every interface) or localhost: etcd binds no host names", listen, on)
	}
	return nil
}

// unspecified: host is 0.0.0.0 or ::, every interface, where nothing
// else reaches this host.
func unspecified(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// bindable is what etcd listens on: an IP address, or localhost.
func bindable(host string) bool { return host == "localhost" || net.ParseIP(host) != nil }

// memberHost checks an http://host:port URL of the member and returns its
// host.
func memberHost(s string) (string, error) {
	if err := checkMemberURL(s); err != nil {
		return "", err
	}
	u, _ := url.Parse(s)
	return u.Hostname(), nil
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
		ListenPeerURL: m.listenPeerURL, ListenClientURL: m.listenClientURL,
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
		client, peer := fmt.Sprintf("--etcd-client-url %q", m.clientURL), fmt.Sprintf("--etcd-peer-url %q", m.peerURL)
		if m.listenClientURL != "" {
			client = fmt.Sprintf("--etcd-listen-client-url %q", m.listenClientURL)
		}
		if m.listenPeerURL != "" {
			peer = fmt.Sprintf("--etcd-listen-peer-url %q", m.listenPeerURL)
		}
		return nil, fmt.Errorf("%s or %s: the address is in use (another etcd or fenced?): stop that process, pick another port, or leave the flag empty for a free one: %w", client, peer, err)
	}
	var inUse *sequencer.DataDirInUseError
	if errors.As(err, &inUse) { // etcd would wait for it without limit (docs/design.md, defect 140)
		dirFlag := m.dirFlag
		if dirFlag == "" {
			dirFlag = "--data-dir"
		}
		return nil, fmt.Errorf("%s %q is in use by %s, a fenced or etcd still running on it (it holds the lock of %s): stop that process, or give another %s",
			dirFlag, m.dataDir, inUse.Holder(), inUse.File, dirFlag)
	}
	if err != nil {
		return nil, err
	}
	attrs := []any{"name", e.Name(), "client_url", e.ClientURL(), "peer_url", e.PeerURL(), "data_dir", e.Dir()}
	if m.listenClientURL != "" {
		attrs = append(attrs, "listen_client_url", m.listenClientURL)
	}
	if m.listenPeerURL != "" {
		attrs = append(attrs, "listen_peer_url", m.listenPeerURL)
	}
	log.Info("embedded etcd member ready", attrs...)
	return e, nil
}
