package chaos

import (
	"slices"
	"strings"
	"testing"

	"github.com/fenced/fenced/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdKeys lists what is left of the locks: not the counter and floor,
// nor an abandoned attempt's mark on a lease that ends within the mark's
// life, but a mark on no lease, or on one that outlives it
// (docs/design.md, defect 206).
func TestEtcdKeys(t *testing.T) {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	leased := func(ttl int64) clientv3.OpOption {
		lg, err := cli.Grant(t.Context(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		return clientv3.WithLease(lg.ID)
	}
	for _, put := range []struct {
		key  string
		opts []clientv3.OpOption
	}{
		{"counter", nil},
		{"floor", nil},
		{"locks/n", nil},
		{"abandoned/on-its-lease", []clientv3.OpOption{leased(60)}},
		{"abandoned/on-no-lease", nil},
		{"abandoned/on-an-hours-lease", []clientv3.OpOption{leased(3600)}},
	} {
		if _, err := cli.Put(t.Context(), prefix+put.key, "", put.opts...); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := etcdKeys(t.Context(), cli, prefix)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{prefix + "abandoned/on-an-hours-lease", prefix + "abandoned/on-no-lease", prefix + "locks/n"}
	if !slices.EqualFunc(keys, want, strings.HasPrefix) {
		t.Fatalf("etcdKeys listed %q, want keys starting %q", keys, want)
	}
}
