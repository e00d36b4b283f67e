package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

const (
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultRedisAddr   = "127.0.0.1:6379"

	// Lock modes, as they appear in the output.
	modeRedisOnly = "redis-only"
	modeFenced    = "fenced"
)

// workerCommand is the hidden first argument that makes the binary a
// worker; the orchestrator starts its workers with it.
const workerCommand = "worker"

// run is the whole program; main only turns its error into an exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == workerCommand {
		return runWorker(ctx, args[1:], stdout)
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	return orchestrate(ctx, cfg, stdout, stderr)
}

// config is the orchestrator's configuration.
type config struct {
	databaseURL string
	redisAddr   string
	fencedURL   string // fenced mode through this fenced service; "": the SDK with an embedded etcd
	schema      string
	modes       []string
	workers     int
	transfers   int // per worker
	accounts    int
	ttl         time.Duration
	pause       time.Duration // the least time the paused worker stays frozen
	timeout     time.Duration
	seed        uint64
	json        bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var mode string
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.databaseURL, "database-url", envOr(defaultDatabaseURL, "DATABASE_URL"),
		"Postgres `URL` (env DATABASE_URL)")
	fs.StringVar(&c.redisAddr, "redis-addr", envOr(defaultRedisAddr, "FENCED_REDIS_ADDR", "REDIS_ADDR"),
		"Redis `host:port` or redis:// URL (env FENCED_REDIS_ADDR, else REDIS_ADDR)")
	fs.StringVar(&c.fencedURL, "fenced-url", os.Getenv("FENCED_URL"),
		"fenced mode through the fenced service at this `URL` (several, comma-separated), with package client;\nempty: package lock in this process, leases in -redis-addr, tokens from an etcd it embeds (env FENCED_URL)")
	fs.StringVar(&c.schema, "schema", "fenced_ledger_example",
		"Postgres `schema` of the ledger, dropped at the start and at the end of each mode")
	fs.StringVar(&mode, "mode", "both", "which lock to run: both, "+modeRedisOnly+" or "+modeFenced)
	fs.IntVar(&c.workers, "workers", 3, "worker processes per mode (at least 2)")
	fs.IntVar(&c.transfers, "transfers", 4, "transfers per worker")
	fs.IntVar(&c.accounts, "accounts", 4, "accounts in the ledger (at least 4: the paused transfer's two, which only the conflicting transfer also touches, and two for the others)")
	fs.DurationVar(&c.ttl, "ttl", 500*time.Millisecond, "lease TTL")
	fs.DurationVar(&c.pause, "pause", 0, "least time the paused worker stays frozen (default 2×ttl)")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the transfer plan: its amounts and accounts (0: a random one); the outcome does not depend on it")
	fs.BoolVar(&c.json, "json", false, "print one JSON object per mode instead of a table")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: ledger [flags]\n\n"+
			"Runs a Postgres ledger under concurrent transfers from worker processes, freezes one\n"+
			"worker between its read and its write past its lease, and checks the ledger: once with\n"+
			"a Redis-only lock, once with fenced. Exit status 0 when fenced kept the invariant.\n\nflags:\n")
		printDefaults(fs)
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	switch mode {
	case "both":
		c.modes = []string{modeRedisOnly, modeFenced}
	case modeRedisOnly, modeFenced:
		c.modes = []string{mode}
	default:
		return c, fmt.Errorf("--mode %q: want both, %s or %s", mode, modeRedisOnly, modeFenced)
	}
	switch {
	case c.workers < 2 || c.workers > 64:
		return c, fmt.Errorf("--workers %d: want 2 to 64 (one is paused, another takes its lock)", c.workers)
	case c.transfers < 1 || c.transfers > 10000:
		return c, fmt.Errorf("--transfers %d: want 1 to 10000", c.transfers)
	case c.accounts < 4 || c.accounts > 10000:
		return c, fmt.Errorf("--accounts %d: want 4 to 10000 (the paused transfer's two accounts are the conflict's alone)", c.accounts)
	case c.ttl < 50*time.Millisecond || c.ttl > time.Minute:
		return c, fmt.Errorf("--ttl %s: want 50ms to 1m", c.ttl)
	case c.pause < 0:
		return c, fmt.Errorf("--pause %s: want >= 0", c.pause)
	case c.timeout <= 0:
		return c, fmt.Errorf("--timeout %s: want > 0", c.timeout)
	}
	if c.pause == 0 {
		c.pause = 2 * c.ttl
	}
	if err := checkSchemaName(c.schema); err != nil {
		return c, err
	}
	if _, err := pgConfig(c.databaseURL, c.schema); err != nil {
		return c, err
	}
	if _, err := redisOptions(c.redisAddr); err != nil {
		return c, err
	}
	if c.fencedURL != "" {
		if _, err := client.New(c.fencedURL); err != nil {
			return c, fmt.Errorf("--fenced-url (or FENCED_URL): %w", err)
		}
	}
	return c, nil
}

// envOr returns the first of the environment variables that is set, else
// def.
func envOr(def string, keys ...string) string {
	for _, k := range keys {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return def
}

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkSchemaName accepts plain lower-case identifiers only: the schema is
// dropped with CASCADE, so it had better be the one this program made.
func checkSchemaName(s string) error {
	if !schemaName.MatchString(s) {
		return fmt.Errorf("--schema %q: want a lower-case identifier of 1 to 63 characters (a-z, 0-9, _), a schema of its own: it is dropped", s)
	}
	if s == "public" || strings.HasPrefix(s, "pg_") || s == "information_schema" {
		return fmt.Errorf("--schema %q: this schema is dropped at the start and the end; give one of its own", s)
	}
	return nil
}

// pgConfig parses the database URL and sets the search path to the
// ledger's schema.
func pgConfig(dsn, schema string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgconn's error leaves the password out.
		return nil, fmt.Errorf("the database URL (--database-url or DATABASE_URL) cannot be parsed: %w; want a URL like %s or key=value pairs like 'host=127.0.0.1 port=5432 dbname=test user=postgres'", err, defaultDatabaseURL)
	}
	cfg.RuntimeParams["search_path"] = schema
	cfg.RuntimeParams["application_name"] = "fenced-ledger-example"
	return cfg, nil
}

// pgTarget names a server and database without the password.
func pgTarget(cfg *pgx.ConnConfig) string {
	return fmt.Sprintf("%s:%d, database %q, user %q", cfg.Host, cfg.Port, cfg.Database, cfg.User)
}

// connectPostgres connects with a bounded wait and says what to do when it
// cannot.
func connectPostgres(ctx context.Context, dsn, schema string) (*pgx.Conn, error) {
	cfg, err := pgConfig(dsn, schema)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to Postgres: %w", ctx.Err())
		}
		return nil, fmt.Errorf("cannot connect to Postgres at %s: %w; check that Postgres runs there and has that database and user, or point --database-url or DATABASE_URL at one that does", pgTarget(cfg), err)
	}
	return conn, nil
}

// redisOptions accepts host:port or a redis:// (rediss://) URL.
func redisOptions(addr string) (*redis.Options, error) {
	if strings.Contains(addr, "://") {
		o, err := redis.ParseURL(addr)
		if err != nil {
			return nil, fmt.Errorf("the Redis address (--redis-addr, FENCED_REDIS_ADDR or REDIS_ADDR) cannot be parsed: %w; want host:port like %s or a URL like redis://%s/0", err, defaultRedisAddr, defaultRedisAddr)
		}
		return o, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("the Redis address (--redis-addr, FENCED_REDIS_ADDR or REDIS_ADDR) %q: %w; want host:port like %s or a URL like redis://%s/0", addr, err, defaultRedisAddr, defaultRedisAddr)
	}
	return &redis.Options{Addr: addr}, nil
}

// connectRedis makes a client and checks it with PING.
func connectRedis(ctx context.Context, addr string) (*redis.Client, error) {
	o, err := redisOptions(addr)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ctxErr := func() error { return fmt.Errorf("connect to Redis: %w", ctx.Err()) }
	// Dial once first: go-redis would retry and log every failed dial.
	var d net.Dialer
	c, err := d.DialContext(pctx, "tcp", o.Addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxErr()
		}
		return nil, fmt.Errorf("cannot reach Redis at %s: %w; start it (redis-server --port 6379), or point --redis-addr, FENCED_REDIS_ADDR or REDIS_ADDR at a running server", o.Addr, err)
	}
	c.Close()
	rdb := redis.NewClient(o)
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		if ctx.Err() != nil {
			return nil, ctxErr()
		}
		return nil, fmt.Errorf("Redis at %s does not answer PING: %w; check the address, database and password in --redis-addr, FENCED_REDIS_ADDR or REDIS_ADDR", o.Addr, err)
	}
	return rdb, nil
}

// drift is the clock-drift allowance of docs/design.md, the same that package
// lock takes off a lease's validity: 1% of the TTL plus 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// printDefaults prints the flags as fenced does, with two dashes (the flag
// package accepts one or two).
func printDefaults(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintf(fs.Output(), "%s\n    \t%s", line, usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(fs.Output(), " (default %s)", f.DefValue)
		}
		fmt.Fprintln(fs.Output())
	})
}
