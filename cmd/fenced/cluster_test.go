package main_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestServeRedisClusterMetrics: with leases on a Redis Cluster, /metrics
// times the store's pipelines as it does on one Redis. They go to each
// master's own client (lock/redispipe.go), which the cluster client's
// hooks do not see, so the metrics hook sits on every node.
func TestServeRedisClusterMetrics(t *testing.T) {
	t.Parallel()
	nodes := testenv.StartRedisCluster(t, 3)
	addrs := nodes[0].Addr + "," + nodes[1].Addr + "," + nodes[2].Addr
	e, _ := testenv.Etcd(t)
	p := start(t, []string{"FENCED_ETCD_ENDPOINTS=" + e.ClientURL()}, "serve", "--listen", "127.0.0.1:0",
		"--redis-cluster-addrs", addrs, "--etcd-prefix", "/"+testenv.Name(t)+"/")
	a := newAPI(t, p.listening())
	const metric = `fenced_redis_command_duration_seconds_count{command="pipeline"}`

	// Concurrent acquires and releases of distinct names, until one of
	// their pipelines (a batch of several calls) shows in /metrics.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	base := testenv.Name(t)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%s-%d", base, i)
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, m, err := a.do("POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":5000}`)
				if err == nil && code != 200 {
					err = fmt.Errorf("acquire %s: HTTP %d %v", name, code, m)
				}
				if err == nil {
					id, _ := m["lease_id"].(string)
					code, m, err = a.do("POST", "/v1/locks/"+name+"/release", `{"lease_id":"`+id+`"}`)
					if err == nil && code != 200 {
						err = fmt.Errorf("release %s: HTTP %d %v", name, code, m)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var body string
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		_, body = a.text("/metrics")
		return strings.Contains(body, metric)
	})
	close(stop)
	wg.Wait()
	if !strings.Contains(body, `fenced_redis_command_duration_seconds_count{command="evalsha"}`) {
		t.Errorf("/metrics lacks the lone calls:\n%s", body)
	}
}
