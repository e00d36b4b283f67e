package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced/fenced/adapters/postgres"
)

const pgSQLSummary = `Print the Postgres fence's migrations as one plain SQL script, for writers
that do not run Go: the fence table, the function fence_admit(resource text,
token bigint) and the version table, in --schema. Pipe it to
psql -v ON_ERROR_STOP=1, or add it to Flyway or Liquibase.

The script is idempotent and safe to run at the same time as another copy or
fenced admin pg-migrate: one transaction takes the same advisory lock and
version table as the Go adapter's Migrate, and applies only what is not
applied yet. A writer then calls SELECT fence_admit('resource', token) as the
first statement of its transaction; a stale token raises SQLSTATE SF001.`

const pgMigrateSummary = `Apply the Postgres fence's migrations to --database-url: the same as piping
fenced admin pg-sql to psql, through the Go adapter's Migrate. Idempotent.`

// pgFlags are the names of the fence's schema and table.
type pgFlags struct {
	schema, table string
}

func (p *pgFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.schema, "schema", "public", "Postgres `schema` of the fence table, fence_admit and the version table; created if missing.")
	fs.StringVar(&p.table, "table", "fence_tokens", "Name of the fence `table`: one row per resource with the highest token admitted. One per schema.")
}

// options checks the names as the adapter does and returns its options.
func (p *pgFlags) options(cmd string) ([]postgres.Option, error) {
	for _, f := range []struct {
		flag string
		opt  postgres.Option
	}{{"schema", postgres.WithSchema(p.schema)}, {"table", postgres.WithTable(p.table)}} {
		if _, err := postgres.MigrationSQL(f.opt); err != nil {
			return nil, usagef(cmd, "--%s: %v", f.flag, err)
		}
	}
	return []postgres.Option{postgres.WithSchema(p.schema), postgres.WithTable(p.table)}, nil
}

func runPgSQL(args []string, stdout io.Writer) (err error) {
	cmd, p := newPgSQLCommand()
	defer cmd.explainEnv(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	if err := cmd.noArgs(); err != nil {
		return err
	}
	opts, err := p.options(cmd.name)
	if err != nil {
		return err
	}
	script, err := postgres.MigrationSQL(opts...)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, script)
	return err
}

func newPgSQLCommand() (*command, *pgFlags) {
	cmd := newCommand("fenced admin pg-sql", "", pgSQLSummary)
	p := &pgFlags{}
	p.register(cmd.fs)
	return cmd, p
}

type pgMigrateOpts struct {
	p       pgFlags
	dbURL   string
	timeout time.Duration
}

func newPgMigrateCommand() (*command, *pgMigrateOpts) {
	cmd := newCommand("fenced admin pg-migrate", "", pgMigrateSummary)
	o := &pgMigrateOpts{}
	cmd.fs.StringVar(&o.dbURL, "database-url", "", "The Postgres to migrate: `URL` postgres://user:password@host:5432/db (or a key=value DSN). Required.\nPrefer the environment variable to keep a password out of ps.")
	o.p.register(cmd.fs)
	cmd.fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "Give up after this long, waiting for another migrator included.")
	return cmd, o
}

func runPgMigrate(ctx context.Context, args []string, stdout io.Writer) (err error) {
	cmd, o := newPgMigrateCommand()
	defer cmd.explainEnv(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	p, dbURL, timeout := &o.p, o.dbURL, o.timeout
	if err := cmd.noArgs(); err != nil {
		return err
	}
	if dbURL == "" {
		return usagef(cmd.name, "--database-url is required: the Postgres to migrate, like postgres://user@127.0.0.1:5432/db (or $%s)", envName("database-url"))
	}
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		// pgx's message shows the URL with its password masked.
		return usagef(cmd.name, "--database-url: %v", err)
	}
	if timeout <= 0 {
		return usagef(cmd.name, "--timeout %s: want > 0", timeout)
	}
	opts, err := p.options(cmd.name)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	where := fmt.Sprintf("Postgres at %s:%d, database %s, user %s", cfg.Host, cfg.Port, strconv.Quote(cfg.Database), strconv.Quote(cfg.User))
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	f, err := postgres.NewFence(conn, opts...)
	if err != nil {
		return err
	}
	if err := f.Migrate(ctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: not done within --timeout %s (another migrator holding the lock?): %w", where, timeout, err)
		}
		return fmt.Errorf("%s: %w", where, withFlagNames(err))
	}
	fmt.Fprintf(stdout, "migrated %s: schema %s has the fence table %s and %s.fence_admit(resource text, token bigint)\n",
		where, strconv.Quote(p.schema), strconv.Quote(p.table), pgx.Identifier{p.schema}.Sanitize())
	return nil
}

// optionFlags puts the adapter's option names, which its errors give for
// SDK users, as the flags of pg-sql and pg-migrate that set them.
var optionFlags = strings.NewReplacer("(WithTable)", "(--table)", "(WithSchema)", "(--schema)")

// withFlagNames is err with the adapter's option names put as flags; it
// still unwraps to err, so errors.Is and errors.As see what they did.
func withFlagNames(err error) error {
	msg := optionFlags.Replace(err.Error())
	if msg == err.Error() {
		return err
	}
	return &flagNamedError{msg: msg, err: err}
}

type flagNamedError struct {
	msg string
	err error
}

func (e *flagNamedError) Error() string { return e.msg }
func (e *flagNamedError) Unwrap() error { return e.err }
