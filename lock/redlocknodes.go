package lock

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/redis/go-redis/v9"
)

// nodeServers is what NewRedlockStore knows of the Redis servers a node's
// client reaches: its endpoints ("tcp 127.0.0.1:6379", "unix /run/redis.sock"),
// none when it cannot tell (a failover client, an unknown implementation),
// and how to name the node in an error.
type nodeServers struct {
	endpoints []string
	addrs     []string // as the client was given them, for the error
	db        int
	what      string // "" for a single server, else the kind of client
}

// serversOf reads a node's client; see NewRedlockStore for what it can
// tell and what not.
func serversOf(rdb redis.UniversalClient) nodeServers {
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		if o.Addr == "FailoverClient" { // go-redis's placeholder: the master is found by asking the sentinels
			return nodeServers{db: o.DB, what: "Sentinel failover client"}
		}
		return nodeServers{endpoints: []string{endpoint(o.Network, o.Addr)}, addrs: []string{o.Addr}, db: o.DB}
	case *redis.ClusterClient:
		n := nodeServers{what: "Cluster client"}
		for _, a := range c.Options().Addrs {
			n.endpoints, n.addrs = append(n.endpoints, endpoint("tcp", a)), append(n.addrs, a)
		}
		return n
	case *redis.Ring:
		o := c.Options()
		n := nodeServers{db: o.DB, what: "Ring"}
		for _, a := range o.Addrs {
			n.endpoints, n.addrs = append(n.endpoints, endpoint("tcp", a)), append(n.addrs, a)
		}
		return n
	}
	return nodeServers{what: fmt.Sprintf("%T", rdb)}
}

// endpoint is a server's address in one spelling: see NewRedlockStore.
func endpoint(network, addr string) string {
	if network == "unix" {
		return "unix " + filepath.Clean(addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return network + " " + addr
	}
	host = strings.ToLower(host)
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	switch host {
	case "", "localhost", "127.0.0.1", "::1":
		host = "loopback"
	}
	return network + " " + net.JoinHostPort(host, port)
}

func (n nodeServers) describe(i int) string {
	switch {
	case len(n.addrs) == 1 && n.what == "":
		return fmt.Sprintf("node %d (%s, db %d)", i, n.addrs[0], n.db)
	case len(n.addrs) > 0:
		return fmt.Sprintf("node %d (%s of %s, db %d)", i, n.what, strings.Join(n.addrs, ","), n.db)
	}
	return fmt.Sprintf("node %d (%s, db %d)", i, n.what, n.db)
}

// distinctServers refuses nodes that NewRedlockStore can tell share a
// Redis server: the same client twice, or two clients of one address.
func distinctServers(nodes []redis.UniversalClient) error {
	servers := make([]nodeServers, len(nodes))
	for i, rdb := range nodes {
		if rdb != nil {
			servers[i] = serversOf(rdb)
		}
	}
	for j := range nodes {
		for i := range j {
			if nodes[i] == nil || nodes[j] == nil {
				continue
			}
			a, b := servers[i], servers[j]
			var how string
			switch {
			case sameClient(nodes[i], nodes[j]):
				how = "are the same client"
			case overlap(a.endpoints, b.endpoints):
				how = "reach the same Redis server"
				if a.db != b.db {
					how += " (two databases of one server fail together)"
				}
			default:
				continue
			}
			return fmt.Errorf("lock: Redlock %s and %s %s: Redlock needs distinct servers, or one server's failure loses a majority",
				a.describe(i), b.describe(j), how)
		}
	}
	return nil
}

// sameClient reports whether a and b are the same client value. Only
// pointers are compared: == on an interface panics for a value that is
// not comparable.
func sameClient(a, b redis.UniversalClient) bool {
	t := reflect.TypeOf(a)
	return t == reflect.TypeOf(b) && t.Kind() == reflect.Pointer && a == b
}

func overlap(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}
