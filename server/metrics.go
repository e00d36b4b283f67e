package server

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of fenced_acquisitions_total, fenced_refreshes_total and
// fenced_releases_total. "invalid" is a request rejected before it reached
// the lease store (400, 413, 415); "cancelled" is a request whose client
// went away (or whose server context ended) before the store answered;
// "error" is the lease store's failure alone, which FencedAcquireErrors
// alerts on: a 503 the store did not cause has a result of its own.
const (
	resultAcquired  = "acquired"
	resultRefreshed = "refreshed"
	resultReleased  = "released"
	resultHeld      = "held"
	resultLost      = "lost"
	// A refresh that arrived after a later one of its lease was applied.
	resultOutOfOrder = "out_of_order"
	resultInvalid    = "invalid"
	resultError      = "error"
	resultCancelled  = "cancelled"
	// Acquisitions only (refresh and release neither wait nor begin a
	// call that the lock client's Close ends): Drain ended the wait, or
	// the lock client is closed.
	resultShuttingDown = "shutting_down"
	// An earlier request of the same acquisition (waiter) is still taking
	// the lock (lock.ErrInProgress, docs/design.md defect 158).
	resultInProgress = "in_progress"
	// The grant came back with no validity left and was released
	// (lock.ErrTTLTooShort): the TTL asked is below the store's latency.
	resultTTLTooShort = "ttl_too_short"
)

type metrics struct {
	acquisitions    *prometheus.CounterVec
	acquireDuration prometheus.Histogram
	tokensIssued    prometheus.Counter
	refreshes       *prometheus.CounterVec
	releases        *prometheus.CounterVec
	leasesLost      prometheus.Counter
	backendErrors   *prometheus.CounterVec
	requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	waiters         prometheus.Gauge
	authRefused     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, leases *leaseTracker) (*metrics, error) {
	m := &metrics{
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_acquisitions_total",
			Help: "Acquire and campaign requests by result: acquired, held (409, after wait_ms if any), invalid (rejected before the lease store), error (lease store failed), cancelled (client went away), shutting_down (Drain ended the wait, or the server is closing), in_progress (an earlier request of the same waiter is still taking the lock), ttl_too_short (the grant came back with no validity left).",
		}, []string{"result"}),
		acquireDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fenced_acquire_duration_seconds",
			Help:    "Time acquire requests spent in the lock client, waiting included, whatever the result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		tokensIssued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_tokens_issued_total",
			Help: "Fencing tokens issued with acquired leases; a reentry or a lost answer's grant found again issues none.",
		}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_refreshes_total",
			Help: "Refresh requests by result: refreshed, lost (410), out_of_order (409: a later refresh of the lease was applied first), invalid, error (lease store failed), cancelled.",
		}, []string{"result"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_releases_total",
			Help: "Release requests by result: released, lost (410), invalid, error (lease store failed), cancelled.",
		}, []string{"result"}),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_leases_lost_total",
			Help: "Refresh or release requests answered lost (410): the lease id no longer holds the lease.",
		}),
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_backend_errors_total",
			Help: "Lease store (Redis, etcd) failures by operation: acquire (campaigns too), refresh, release, inspect, list, force_release, leader (an election's), ready.",
		}, []string{"op"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_http_requests_total",
			Help: "HTTP requests by route (the OpenAPI path, or \"unmatched\") and status code.",
		}, []string{"route", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fenced_http_request_duration_seconds",
			Help:    "Time to answer HTTP requests, by route (the OpenAPI path, or \"unmatched\"); an acquire's includes its wait.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"route"}),
		waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fenced_waiters",
			Help: "Acquire requests with wait_ms > 0 in progress now: waiting for a held lock, or about to get it.",
		}),
		authRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_auth_refused_total",
			Help: "Requests refused by authentication (code unauthenticated: 401) or by a token's permissions (forbidden: 403).",
		}, []string{"code"}),
	}
	activeLeases := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fenced_active_leases",
		Help: "Leases acquired through this server that, as far as it knows, are still held: not released, not answered lost, and not past their TTL since the last acquire or refresh through it.",
	}, func() float64 { return float64(leases.count(time.Now())) })
	for _, c := range []prometheus.Collector{m.acquisitions, m.acquireDuration, m.tokensIssued, m.refreshes,
		m.releases, m.leasesLost, m.backendErrors, m.requests, m.requestDuration, m.waiters, m.authRefused, activeLeases} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Every result and op from the start, so that rates work from zero.
	for _, r := range []string{resultAcquired, resultHeld, resultInvalid, resultError, resultCancelled,
		resultShuttingDown, resultInProgress, resultTTLTooShort} {
		m.acquisitions.WithLabelValues(r)
	}
	for _, r := range []string{resultRefreshed, resultLost, resultOutOfOrder, resultInvalid, resultError, resultCancelled} {
		m.refreshes.WithLabelValues(r)
	}
	for _, r := range []string{resultReleased, resultLost, resultInvalid, resultError, resultCancelled} {
		m.releases.WithLabelValues(r)
	}
	for _, op := range backendOps {
		m.backendErrors.WithLabelValues(op)
	}
	for _, c := range []string{string(codeUnauthenticated), string(codeForbidden)} {
		m.authRefused.WithLabelValues(c)
	}
	for _, rt := range routes {
		m.requestDuration.WithLabelValues(rt.pattern)
	}
	return m, nil
}

// leaseTracker counts the leases acquired through this server that it
// believes are still held. It keeps each lease's expected expiry and drops
// entries lazily: when the gauge is read, and on acquire at most once per
// sweepEvery. No goroutine.
//
// Answers come back in any order: a refresh the store applied before a
// release may be answered after it. So only an acquire adds a lease; a
// refresh extends one still tracked and never brings back one that a
// release, a loss or a force-release took off (docs/design.md, defect 218).
// A lease acquired through another node is that node's to count.
type leaseTracker struct {
	mu        sync.Mutex
	leases    map[leaseKey]trackedLease
	lastSweep time.Time
}

type leaseKey struct{ name, id string }

type trackedLease struct {
	deadline time.Time
	// reentered: seen held more than once (a reentrant holder's), so that
	// a release may leave it held.
	reentered bool
	// ended: answered lost, or force-released. Its lease id never holds
	// the lock again, so an acquire answered late (a reentry the store
	// applied first) must not count it again. Kept, uncounted, until swept.
	ended bool
}

const sweepEvery = time.Second

// expiredKept is how long an entry stays, uncounted, after its deadline.
// The deadline is measured from before the last acquire or refresh
// reached the store, so the store's lease outlives it a little: a refresh
// the store applied in that margin, or answered late, still finds the
// lease it extends. An ended entry keeps late answers off as long.
const expiredKept = time.Minute

func newLeaseTracker() *leaseTracker {
	return &leaseTracker{leases: make(map[leaseKey]trackedLease)}
}

// acquired records that an acquire (or campaign) through this server was
// granted name's lease id until deadline, and whether id holds it more
// than once now; once reentered, a lease stays marked so. A lease
// released meanwhile is counted again, rightly: a release that a reentry
// overtook only counted a hold down.
func (t *leaseTracker) acquired(name, id string, deadline time.Time, reentered bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := leaseKey{name, id}
	l := t.leases[k]
	if l.ended {
		return
	}
	t.leases[k] = trackedLease{deadline: deadline, reentered: reentered || l.reentered}
	if now := time.Now(); now.Sub(t.lastSweep) >= sweepEvery {
		t.sweep(now)
	}
}

// refreshed records that a refresh through this server extended name's
// lease id until deadline. It adds no lease: one not tracked was acquired
// through another node, or was taken off by a release or a loss that this
// refresh's answer came after.
func (t *leaseTracker) refreshed(name, id string, deadline time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := leaseKey{name, id}
	if l, ok := t.leases[k]; ok && !l.ended {
		l.deadline = deadline
		t.leases[k] = l
	}
}

// reentered reports whether id was seen holding name more than once, so
// that a release may not have freed it.
func (t *leaseTracker) reentered(name, id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.leases[leaseKey{name, id}].reentered
}

// released records that a release by id freed name.
func (t *leaseTracker) released(name, id string) {
	t.mu.Lock()
	delete(t.leases, leaseKey{name, id})
	t.mu.Unlock()
}

// ended records that id no longer holds name and never will again: a
// refresh or release answered lost, or a force-release.
func (t *leaseTracker) ended(name, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := leaseKey{name, id}
	if l, ok := t.leases[k]; ok {
		t.leases[k] = trackedLease{deadline: later(l.deadline, time.Now()), ended: true}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (t *leaseTracker) count(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweep(now)
	n := 0
	for _, l := range t.leases {
		if !l.ended && now.Before(l.deadline) {
			n++
		}
	}
	return n
}

func (t *leaseTracker) sweep(now time.Time) {
	for k, l := range t.leases {
		if !now.Before(l.deadline.Add(expiredKept)) {
			delete(t.leases, k)
		}
	}
	t.lastSweep = now
}
