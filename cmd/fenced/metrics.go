package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
)

// daemonMetrics is the registry GET /metrics serves: the server's metrics,
// the Go and process collectors, fenced_build_info, and the latency of
// every call to etcd and Redis, measured from outside package lock (a gRPC
// interceptor on the etcd client, a go-redis hook).
type daemonMetrics struct {
	reg   *prometheus.Registry
	etcd  *prometheus.HistogramVec
	redis *prometheus.HistogramVec
}

// backendBuckets span a local Redis command to an etcd write on a slow disk.
var backendBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func newDaemonMetrics() (*daemonMetrics, error) {
	m := &daemonMetrics{
		reg: prometheus.NewRegistry(),
		etcd: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fenced_etcd_request_duration_seconds",
			Help:    "Time of each unary etcd request (KV Range, Put, Txn; Lease Grant, Revoke), by method, failures included. Streams (watches, keep-alives) are not timed.",
			Buckets: backendBuckets,
		}, []string{"method"}),
		redis: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fenced_redis_command_duration_seconds",
			Help:    "Time of each Redis command (the lease scripts run as evalsha), by command; a pipeline is one \"pipeline\". Failures included.",
			Buckets: backendBuckets,
		}, []string{"command"}),
	}
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fenced_build_info",
		Help: "Always 1; the labels say which fenced this is: its version and the Go version it was built with.",
	}, []string{"version", "goversion"})
	info.WithLabelValues(buildVersion(), runtime.Version()).Set(1)
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		info, m.etcd, m.redis,
	} {
		if err := m.reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return m, nil
}

// etcdDialOptions time every unary call of an etcd client.
func (m *daemonMetrics) etcdDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			start := time.Now()
			err := invoker(ctx, method, req, reply, cc, opts...)
			m.etcd.WithLabelValues(etcdMethod(method)).Observe(time.Since(start).Seconds())
			return err
		})}
}

// etcdMethod shortens a gRPC method: /etcdserverpb.KV/Txn is KV/Txn.
func etcdMethod(full string) string {
	full = strings.TrimPrefix(full, "/")
	if i := strings.IndexByte(full, '.'); i >= 0 {
		return full[i+1:]
	}
	return full
}

// redisHook times every command of a go-redis client.
type redisHook struct{ h *prometheus.HistogramVec }

var _ redis.Hook = redisHook{}

func (redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		r.h.WithLabelValues(strings.ToLower(cmd.Name())).Observe(time.Since(start).Seconds())
		return err
	}
}

func (r redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		r.h.WithLabelValues("pipeline").Observe(time.Since(start).Seconds())
		return err
	}
}

// redisLogger passes go-redis's own log lines (a pool that cannot dial, a
// pub/sub connection re-established) to slog, so that they keep the log's
// format: a JSON log stays JSON.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	l.log.LogAttrs(ctx, slog.LevelWarn, msg, slog.String("component", "go-redis"))
}
