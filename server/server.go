package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fenced/fenced/lock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config configures a Server. Only Locks is required; every other zero
// value means the default its comment states.
type Config struct {
	// Locks is the lock client the API serves. Required. The server does not
	// close it.
	Locks *lock.Client
	// Ready checks that the backends (Redis and etcd) answer and take
	// writes; GET /readyz is 200 only when it returns nil. nil means
	// Locks.Store().Ping, which checks both backends of every store of the
	// lock package (a RedisStore's, its sequencer's etcd too).
	Ready func(ctx context.Context) error
	// Logger receives one debug line per request and warnings about backend
	// failures. nil means slog.Default().
	Logger *slog.Logger
	// Registerer is where the server registers its metrics. nil means a new
	// private registry, with the Go and process collectors added.
	Registerer prometheus.Registerer
	// Gatherer is what GET /metrics serves. nil means the private registry,
	// or Registerer if it is also a Gatherer (as *prometheus.Registry is).
	Gatherer prometheus.Gatherer
	// Tokens are the bearer tokens that may use the API and /metrics, each
	// with its permissions and lock name prefixes (GET /healthz, /readyz
	// and /v1/openapi.yaml stay open). nil means no authentication.
	// LoadTokens reads them from a file; Server.SetTokens replaces them
	// while the server runs.
	Tokens *Tokens
	// MaxBodyBytes bounds a request body; a larger one is a 413. Default
	// 64 KiB; at least MinMaxBodyBytes.
	MaxBodyBytes int64
	// MinTTL and MaxTTL bound ttl_ms. Defaults lock.MinTTL (10ms) and
	// lock.MaxTTL (24h); they must lie within those and be whole
	// milliseconds.
	MinTTL, MaxTTL time.Duration
	// DefaultTTL is the TTL of an acquire or refresh without ttl_ms.
	// Default 30s; it must lie within MinTTL to MaxTTL.
	DefaultTTL time.Duration
	// MaxWait bounds wait_ms. Default 60s.
	MaxWait time.Duration
	// BackendTimeout bounds the lease store calls of one request, on top of
	// its wait_ms. A store that does not answer in time is a 503 with
	// Retry-After, logged with the backend and the time it took. Default
	// 10s.
	BackendTimeout time.Duration
	// ReadyTimeout bounds the check of GET /readyz, so that a probe with a
	// one-second timeout (Kubernetes' default) gets a 503 rather than no
	// answer when a backend hangs. Default 800ms.
	ReadyTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultMaxBodyBytes = 64 << 10
	// MinMaxBodyBytes is the least MaxBodyBytes: the API's largest request
	// (an acquire with both labels of 128 bytes, each character escaped as
	// \u00XX) fits in 2 KiB. Below it a server refused requests of its own
	// API, the curl line it prints at start among them (docs/design.md,
	// defect 210).
	MinMaxBodyBytes       = 4 << 10
	DefaultTTL            = 30 * time.Second
	DefaultMaxWait        = 60 * time.Second
	DefaultBackendTimeout = 10 * time.Second
	DefaultReadyTimeout   = 800 * time.Millisecond
)

// Server is the HTTP handler of the v1 API. It keeps no goroutine: leases
// are acquired detached, and their remote holder refreshes and releases
// them by lease id. It is safe for concurrent use.
type Server struct {
	locks          *lock.Client
	ready          func(context.Context) error
	log            *slog.Logger
	tokens         atomic.Pointer[Tokens] // nil: no authentication
	maxBody        int64
	limits         limits
	backendTimeout time.Duration
	readyTimeout   time.Duration
	metrics        *metrics
	leases         *leaseTracker
	metricsHandler http.Handler
	drained        context.Context    // ended by Drain
	drain          context.CancelFunc //
}

// New checks cfg and returns a Server. An invalid field is a *ConfigError
// that names it.
func New(cfg Config) (*Server, error) {
	if cfg.Locks == nil {
		return nil, &ConfigError{Field: "Locks", Want: "required"}
	}
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	s := &Server{
		locks:          cfg.Locks,
		ready:          cfg.Ready,
		log:            cfg.Logger,
		maxBody:        cfg.MaxBodyBytes,
		backendTimeout: cfg.BackendTimeout,
		readyTimeout:   cfg.ReadyTimeout,
		limits: limits{minTTL: cfg.MinTTL, maxTTL: cfg.MaxTTL,
			defaultTTL: cfg.DefaultTTL, maxWait: cfg.MaxWait},
		leases: newLeaseTracker(),
	}
	s.drained, s.drain = context.WithCancel(context.Background())
	s.applyDefaults()
	if s.ready == nil {
		s.ready = cfg.Locks.Store().Ping
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.tokens.Store(cfg.Tokens)

	reg, gath := cfg.Registerer, cfg.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		if err := r.Register(collectors.NewGoCollector()); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
		if err := r.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
		reg = r
		if gath == nil {
			gath = r
		}
	}
	if gath == nil {
		g, ok := reg.(prometheus.Gatherer)
		if !ok {
			return nil, &ConfigError{Field: "Gatherer", Want: "required when Config.Registerer is not a prometheus.Gatherer"}
		}
		gath = g
	}
	var err error
	if s.metrics, err = newMetrics(reg, s.leases); err != nil {
		return nil, fmt.Errorf("server: Config.Registerer: %w", err)
	}
	s.metricsHandler = promhttp.HandlerFor(gath, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	})
	return s, nil
}

// SetTokens replaces the bearer tokens, for example after the token file
// changed: requests that arrive afterwards are checked against t. nil is an
// error, since it would turn authentication off; a server started without
// tokens begins to require them.
func (s *Server) SetTokens(t *Tokens) error {
	if t == nil {
		return errors.New("server: SetTokens(nil) would turn authentication off; restart without tokens for that")
	}
	s.tokens.Store(t)
	return nil
}

// ConfigError is a Config field that New refuses: Field is its name
// ("MaxTTL"), Value what it was, Want what it may be.
type ConfigError struct {
	Field string
	Value any
	Want  string
}

func (e *ConfigError) Error() string {
	if e.Value == nil {
		return fmt.Sprintf("server: Config.%s: %s", e.Field, e.Want)
	}
	return fmt.Sprintf("server: Config.%s %v: %s", e.Field, e.Value, e.Want)
}

// Check checks the limits and timeouts of cfg, as New does (New also needs
// Locks): a caller can check its configuration before it has a lock
// client. An invalid field is a *ConfigError.
func (cfg Config) Check() error {
	s := &Server{maxBody: cfg.MaxBodyBytes, backendTimeout: cfg.BackendTimeout, readyTimeout: cfg.ReadyTimeout,
		limits: limits{minTTL: cfg.MinTTL, maxTTL: cfg.MaxTTL, defaultTTL: cfg.DefaultTTL, maxWait: cfg.MaxWait}}
	if s.maxBody < 0 || s.maxBody > 0 && s.maxBody < MinMaxBodyBytes {
		return &ConfigError{"MaxBodyBytes", s.maxBody, fmt.Sprintf("want at least %d, the API's largest request with room to spare (0 means %d)", MinMaxBodyBytes, DefaultMaxBodyBytes)}
	}
	if s.limits.maxWait < 0 {
		return &ConfigError{"MaxWait", s.limits.maxWait, fmt.Sprintf("want > 0 (0 means %s)", DefaultMaxWait)}
	}
	if s.backendTimeout < 0 {
		return &ConfigError{"BackendTimeout", s.backendTimeout, fmt.Sprintf("want > 0 (0 means %s)", DefaultBackendTimeout)}
	}
	if s.readyTimeout < 0 {
		return &ConfigError{"ReadyTimeout", s.readyTimeout, fmt.Sprintf("want > 0 (0 means %s)", DefaultReadyTimeout)}
	}
	s.applyDefaults()
	l := &s.limits
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"MinTTL", l.minTTL}, {"MaxTTL", l.maxTTL}, {"DefaultTTL", l.defaultTTL}, {"MaxWait", l.maxWait}} {
		if f.d%time.Millisecond != 0 {
			return &ConfigError{f.name, f.d, "want whole milliseconds"}
		}
	}
	switch {
	case l.minTTL < lock.MinTTL || l.minTTL > lock.MaxTTL:
		return &ConfigError{"MinTTL", l.minTTL, fmt.Sprintf("want %s to %s", lock.MinTTL, lock.MaxTTL)}
	case l.maxTTL < l.minTTL || l.maxTTL > lock.MaxTTL:
		return &ConfigError{"MaxTTL", l.maxTTL, fmt.Sprintf("want %s to %s", l.minTTL, lock.MaxTTL)}
	case l.defaultTTL < l.minTTL || l.defaultTTL > l.maxTTL:
		return &ConfigError{"DefaultTTL", l.defaultTTL, fmt.Sprintf("want %s to %s (MinTTL to MaxTTL)", l.minTTL, l.maxTTL)}
	}
	return nil
}

// applyDefaults replaces zero values by their defaults.
func (s *Server) applyDefaults() {
	if s.maxBody == 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	l := &s.limits
	if l.minTTL == 0 {
		l.minTTL = lock.MinTTL
	}
	if l.maxTTL == 0 {
		l.maxTTL = lock.MaxTTL
	}
	if l.defaultTTL == 0 {
		l.defaultTTL = DefaultTTL
	}
	if l.maxWait == 0 {
		l.maxWait = DefaultMaxWait
	}
	if s.backendTimeout == 0 {
		s.backendTimeout = DefaultBackendTimeout
	}
	if s.readyTimeout == 0 {
		s.readyTimeout = DefaultReadyTimeout
	}
}

// A route of the API. pattern is its path as in api/openapi.yaml.
type route struct {
	pattern string
	method  string     // GET routes also answer HEAD
	perm    Permission // what a token needs; 0: open, served without authentication
	op      string     // the operation, for 403 answers and the invalid results of acquire (campaign too), refresh and release (countInvalid)
	handle  func(s *Server, w http.ResponseWriter, r *http.Request, name string)
	// query is what the route takes in its query string, as
	// api/openapi.yaml documents it: ServeHTTP refuses any other parameter,
	// and a query string that does not decode, before the handler runs
	// (docs/design.md, defect 123). anyQuery routes (the probes, /metrics
	// and the document, which document no 400) never read theirs.
	query    []string
	anyQuery bool
	body     []string // the fields of its JSON body, for the 400's message
}

var (
	routeHealthz  = &route{pattern: "/healthz", method: http.MethodGet, handle: (*Server).healthz, anyQuery: true}
	routeReadyz   = &route{pattern: "/readyz", method: http.MethodGet, handle: (*Server).readyz, anyQuery: true}
	routeMetrics  = &route{pattern: "/metrics", method: http.MethodGet, perm: PermMetrics, op: "read metrics", handle: (*Server).serveMetrics, anyQuery: true}
	routeInspect  = &route{pattern: "/v1/locks/{name}", method: http.MethodGet, perm: PermInspect, op: opInspect, handle: (*Server).inspect}
	routeForce    = &route{pattern: "/v1/locks/{name}", method: http.MethodDelete, perm: PermForceRelease, op: "force-release", handle: (*Server).forceRelease, query: []string{fieldToken}}
	routeList     = &route{pattern: "/v1/locks", method: http.MethodGet, perm: PermInspect, op: "list locks", handle: (*Server).list, query: []string{fieldPrefix, fieldLimit, fieldCursor}}
	routeAcquire  = &route{pattern: "/v1/locks/{name}/acquire", method: http.MethodPost, perm: PermAcquire, op: opAcquire, handle: (*Server).acquire, body: acquireFields}
	routeRefresh  = &route{pattern: "/v1/locks/{name}/refresh", method: http.MethodPost, perm: PermAcquire, op: opRefresh, handle: (*Server).refresh, body: refreshFields}
	routeRelease  = &route{pattern: "/v1/locks/{name}/release", method: http.MethodPost, perm: PermAcquire, op: opRelease, handle: (*Server).release, body: releaseFields}
	routeOpenAPI  = &route{pattern: "/v1/openapi.yaml", method: http.MethodGet, handle: (*Server).serveOpenAPI, anyQuery: true}
	routeLeader   = &route{pattern: "/v1/elections/{name}", method: http.MethodGet, perm: PermInspect, op: opLeader, handle: (*Server).leader, query: []string{fieldAfter, fieldWaitMs}}
	routeCampaign = &route{pattern: "/v1/elections/{name}/campaign", method: http.MethodPost, perm: PermAcquire, op: opCampaign, handle: (*Server).campaign, body: campaignFields}

	routes = []*route{routeHealthz, routeReadyz, routeMetrics, routeList, routeInspect, routeForce, routeAcquire, routeRefresh, routeRelease, routeOpenAPI, routeLeader, routeCampaign}
)

const (
	locksPrefix     = "/v1/locks/"
	electionsPrefix = "/v1/elections/"
)

// match finds the route of an escaped path and the escaped lock name in
// it. The path is not cleaned: "/v1/locks/a/b/acquire" is the lock "a/b"
// (a 400 once the name is checked), not a 404; so is "a%2Fb". A path under
// /v1/locks/ with more than one segment whose last is not an action is a
// lock name with a slash for GET and HEAD, and an unknown path otherwise.
func match(path, method string) (rt *route, rawName string) {
	switch path {
	case "/healthz":
		return routeHealthz, ""
	case "/readyz":
		return routeReadyz, ""
	case "/metrics":
		return routeMetrics, ""
	case "/v1/openapi.yaml":
		return routeOpenAPI, ""
	case "/v1/locks":
		return routeList, ""
	}
	if rest, ok := strings.CutPrefix(path, electionsPrefix); ok {
		// An election's name is a lock name: the same rules, slashes
		// included.
		if name, ok := strings.CutSuffix(rest, "/campaign"); ok {
			return routeCampaign, name
		}
		if strings.IndexByte(rest, '/') >= 0 && method != http.MethodGet && method != http.MethodHead {
			return nil, ""
		}
		return routeLeader, rest
	}
	rest, ok := strings.CutPrefix(path, locksPrefix)
	if !ok {
		return nil, ""
	}
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		switch rest[i+1:] {
		case "acquire":
			return routeAcquire, rest[:i]
		case "refresh":
			return routeRefresh, rest[:i]
		case "release":
			return routeRelease, rest[:i]
		}
		if method != http.MethodGet && method != http.MethodHead && method != http.MethodDelete {
			return nil, ""
		}
	}
	if method == http.MethodDelete {
		return routeForce, rest
	}
	return routeInspect, rest
}

// lockName decodes and checks the lock name of a path.
func lockName(rawName string) (string, *apiError) {
	name, err := url.PathUnescape(rawName)
	if err != nil {
		return "", invalid(fieldName, fmt.Sprintf("lock name %s: %v", excerpt([]byte(rawName)), err))
	}
	if err := lock.ValidateName(name); err != nil {
		return "", invalid(fieldName, err.Error())
	}
	return name, nil
}

// escapedSlash reports whether an escaped lock name holds a %2F, which
// makes it no lock name whatever the route.
func escapedSlash(rawName string) bool {
	return strings.Contains(rawName, "%2F") || strings.Contains(rawName, "%2f")
}

// checkQuery parses the query string of r and refuses it if it does not
// decode, or names a parameter the route does not take, or one more than
// once; nil for an anyQuery route, which ignores its query string, and
// for an empty one.
func (rt *route) checkQuery(r *http.Request) (url.Values, *apiError) {
	if rt.anyQuery || r.URL.RawQuery == "" {
		return nil, nil // nothing to parse on the acquire and release path
	}
	q, aerr := query(r)
	if aerr != nil {
		return nil, aerr
	}
	op := rt.method + " " + rt.pattern
	for k, v := range q {
		if slices.Contains(rt.query, k) {
			if len(v) > 1 {
				return nil, invalid(k, fmt.Sprintf("%s given %d times: give it once", k, len(v)))
			}
			continue
		}
		msg := fmt.Sprintf("unknown query parameter %s: %s takes %s", excerpt([]byte(k)), op, strings.Join(rt.query, ", "))
		switch {
		case len(rt.query) > 0:
		case len(rt.body) > 0:
			msg = fmt.Sprintf("unknown query parameter %s: %s takes no query parameters; it takes its arguments in the JSON body (%s)", excerpt([]byte(k)), op, strings.Join(quoteAll(rt.body), ", "))
			if slices.Contains(rt.body, k) {
				msg += fmt.Sprintf(`: send {"%s":…} in the body`, k)
			}
		default:
			msg = fmt.Sprintf("unknown query parameter %s: %s takes no query parameters", excerpt([]byte(k)), op)
		}
		return nil, invalid("", msg)
	}
	return q, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w}
	var tok *tokenEntry // the caller's token, once authenticated
	rt, rawName := match(r.URL.EscapedPath(), r.Method)
	label := "unmatched"
	if rt != nil {
		label = rt.pattern
	}
	defer func() {
		status := rec.status
		if status == 0 {
			status = http.StatusOK
		}
		if status >= 500 && r.Context().Err() != nil {
			status = 499 // nginx's "client closed request": nobody got the answer
		}
		took := time.Since(start)
		s.metrics.requests.WithLabelValues(label, fmt.Sprint(status)).Inc()
		s.metrics.requestDuration.WithLabelValues(label).Observe(took.Seconds())
		attrs := []slog.Attr{slog.String("method", r.Method), slog.String("path", r.URL.EscapedPath()),
			slog.String("route", label), slog.Int("status", status),
			slog.String("duration", took.String()), slog.String("remote", r.RemoteAddr)}
		if tok != nil {
			attrs = append(attrs, slog.String("token", tok.name))
		}
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "http request", attrs...)
	}()
	tokens := s.tokens.Load()
	if (rt == nil || rt.perm != 0) && tokens != nil {
		var err error
		if tok, err = tokens.authenticate(r); err != nil {
			s.metrics.authRefused.WithLabelValues(string(codeUnauthenticated)).Inc()
			rec.Header().Set("WWW-Authenticate", `Bearer realm="fenced"`)
			writeError(rec, &apiError{status: http.StatusUnauthorized, code: codeUnauthenticated, message: err.Error()})
			return
		}
	}
	if rt == nil {
		// field path: a client tells this from a 404 about a lock, which
		// a force-release of a free lock answers (defect 46).
		writeError(rec, &apiError{status: http.StatusNotFound, code: codeNotFound, field: fieldPath,
			message: fmt.Sprintf("no such path %s; the API is under %s{name} (GET) and %s{name}/acquire|refresh|release (POST), and %s{name} (GET) and %s{name}/campaign (POST); GET /v1/openapi.yaml describes it", excerpt([]byte(r.URL.EscapedPath())), locksPrefix, locksPrefix, electionsPrefix, electionsPrefix)})
		return
	}
	if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) && escapedSlash(rawName) {
		// "POST /v1/locks/x%2Facquire" is no acquire of "x" but a name
		// with a slash, which the name's 400 says, whatever the method,
		// rather than a 405 of GET /v1/locks/{name}. (Not counted as an
		// invalid request of rt: it was no request of rt.)
		if _, aerr := lockName(rawName); aerr != nil {
			writeError(rec, aerr)
			return
		}
	}
	if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) {
		allow := rt.method
		if rt.method == http.MethodGet {
			allow = "GET, HEAD"
		}
		if rt == routeInspect {
			allow += ", DELETE"
		}
		rec.Header().Set("Allow", allow)
		writeError(rec, &apiError{status: http.StatusMethodNotAllowed, code: codeMethodNotAllowed,
			message: fmt.Sprintf("method %s: %s allows %s", excerpt([]byte(r.Method)), rt.pattern, allow)})
		return
	}
	var name string
	if strings.HasPrefix(rt.pattern, locksPrefix) || strings.HasPrefix(rt.pattern, electionsPrefix) {
		var aerr *apiError
		if name, aerr = lockName(rawName); aerr != nil {
			s.countInvalid(rt.op)
			writeError(rec, aerr)
			return
		}
	}
	// Before authorization: a prefix the query string does not say
	// clearly is the list's 400, not a 403 about a prefix read past a bad
	// pair.
	q, aerr := rt.checkQuery(r)
	if aerr != nil {
		s.countInvalid(rt.op)
		writeError(rec, aerr)
		return
	}
	if tok != nil {
		aerr := tok.authorize(rt.perm, rt.op, name)
		if aerr == nil && rt == routeList {
			aerr = tok.authorizePrefix(rt.op, q.Get(fieldPrefix))
		}
		if aerr != nil {
			s.metrics.authRefused.WithLabelValues(string(codeForbidden)).Inc()
			attrs := []slog.Attr{slog.String("token", tok.name), slog.String("op", rt.op), slog.String("allow", tok.allow.String())}
			if name != "" {
				attrs = append(attrs, slog.String("lock", name))
			}
			s.log.LogAttrs(r.Context(), slog.LevelInfo, "forbidden", attrs...)
			writeError(rec, aerr)
			return
		}
	}
	if tok != nil {
		r = r.WithContext(context.WithValue(r.Context(), callerKey{}, tok.name))
	}
	rt.handle(s, rec, r, name)
}

// callerKey carries the name of the caller's token to the handlers.
type callerKey struct{}

// callerToken is the name of the token the request came with; "" without
// authentication.
func callerToken(ctx context.Context) string {
	name, _ := ctx.Value(callerKey{}).(string)
	return name
}

// recorder remembers the status a handler wrote.
type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
