package postgres

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// MigrationLockKey is the key of the PostgreSQL advisory lock that
// [Fence.Migrate] holds for the length of its transaction, so that
// processes migrating at the same time take turns. Its value is "fenced" in
// ASCII.
const MigrationLockKey int64 = 0x66656e636564

// sqlStateInsufficientPrivilege is what the server answers a statement its
// role may not run.
const sqlStateInsufficientPrivilege = "42501"

// versionTable records the migrations applied in a schema.
const versionTable = "fence_schema_version"

type migration struct {
	version int
	name    string
	sql     string
}

type migrateSQL struct {
	readOnly, schemaExists, createSchema, versionTableExists, versionTable, applied, record, lock, check string
	migrations                                                                                           []migration
}

// renderMigrate renders the migration runner's statements and the
// versioned migrations, migrations/NNNN_name.sql, in version order.
func renderMigrate(idents map[string]string) (migrateSQL, error) {
	var m migrateSQL
	err := renderAll(idents, map[string]*string{
		"sql/refuse_read_only.sql":     &m.readOnly,
		"sql/migrate_lock.sql":         &m.lock,
		"sql/schema_exists.sql":        &m.schemaExists,
		"sql/create_schema.sql":        &m.createSchema,
		"sql/version_table_exists.sql": &m.versionTableExists,
		"sql/version_table.sql":        &m.versionTable,
		"sql/versions_applied.sql":     &m.applied,
		"sql/version_record.sql":       &m.record,
		"sql/fence_table_check.sql":    &m.check,
	})
	if err != nil {
		return m, err
	}
	files, err := fs.Glob(sqlFiles, "migrations/*.sql")
	if err != nil {
		return m, fmt.Errorf("postgres: embedded migrations: %w", err)
	}
	for _, f := range files {
		base := strings.TrimSuffix(path.Base(f), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return m, fmt.Errorf("postgres: embedded migration %s: want NNNN_name.sql", f)
		}
		s, err := render(f, idents)
		if err != nil {
			return m, err
		}
		m.migrations = append(m.migrations, migration{version: v, name: name, sql: s})
	}
	slices.SortFunc(m.migrations, func(a, b migration) int { return a.version - b.version })
	for i := 1; i < len(m.migrations); i++ {
		if m.migrations[i].version == m.migrations[i-1].version {
			return m, fmt.Errorf("postgres: embedded migrations: version %d twice", m.migrations[i].version)
		}
	}
	return m, nil
}

// Migrate creates or upgrades, in the Fence's schema, the fence table, the
// function fence_admit(resource text, token bigint) and the table
// fence_schema_version that records the migrations applied. It creates the
// schema if it is missing.
//
// When every migration is recorded, Migrate creates nothing and needs no
// CREATE privilege: a role that only writes may run it at every start. When
// something is missing and the role may not create it, the error (SQLSTATE
// 42501) says to run Migrate once as the schema's owner, or to grant CREATE.
//
// Migrate is idempotent and safe to run from several processes at once: it
// runs in one READ COMMITTED transaction that first takes the advisory lock
// [MigrationLockKey], applies only the migrations not recorded yet, and
// commits them together with their records. A schema that already holds a
// fence table of another name, or a table of the fence table's name that is
// not a fence table (created before, for something else), is an error
// matching [ErrInvalidOption], and nothing is migrated. So is a read-only
// transaction (SQLSTATE 25006: a hot-standby replica, or
// default_transaction_read_only on), even with every migration applied:
// every admit would fail there.
func (f *Fence) Migrate(ctx context.Context) error {
	// READ COMMITTED so that each statement after the lock sees what an
	// earlier migrator committed while this one waited.
	opts := pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	err := inTx(ctx, f.db, opts, func(ctx context.Context, tx pgx.Tx) error {
		return f.migrateTx(ctx, tx)
	}, nil)
	if err != nil {
		return dbError(ctx, fmt.Errorf("postgres: migrate schema %q: %w", f.schema, err))
	}
	return nil
}

func (f *Fence) migrateTx(ctx context.Context, tx pgx.Tx) error {
	m := &f.migrate
	if _, err := tx.Exec(ctx, m.readOnly); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, m.lock, MigrationLockKey); err != nil {
		return err
	}
	// Only create a missing schema: CREATE SCHEMA IF NOT EXISTS needs the
	// CREATE privilege on the database even when the schema exists.
	var exists bool
	if err := tx.QueryRow(ctx, m.schemaExists, f.schema).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := tx.Exec(ctx, m.createSchema); err != nil {
			return f.mayNotCreate(err, "database")
		}
	}
	// Nor the version table: CREATE TABLE IF NOT EXISTS needs CREATE on the
	// schema even when the table exists, and a role that only uses the
	// fence runs Migrate at start too.
	if err := tx.QueryRow(ctx, m.versionTableExists, f.schema, versionTable).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := tx.Exec(ctx, m.versionTable); err != nil {
			return f.mayNotCreate(err, "schema")
		}
	}
	rows, err := tx.Query(ctx, m.applied)
	if err != nil {
		return err
	}
	applied := map[int]bool{}
	var v int
	var table string
	_, err = pgx.ForEachRow(rows, []any{&v, &table}, func() error {
		if table != f.table {
			return fmt.Errorf("%w: schema %q already has the fence table %q, not %q; one fence table per schema",
				ErrInvalidOption, f.schema, table, f.table)
		}
		applied[v] = true
		return nil
	})
	if err != nil {
		return err
	}
	for _, mig := range m.migrations {
		if applied[mig.version] {
			continue
		}
		if _, err := tx.Exec(ctx, mig.sql); err != nil {
			return fmt.Errorf("migration %04d_%s: %w", mig.version, mig.name, f.mayNotCreate(err, "schema"))
		}
		if _, err := tx.Exec(ctx, m.record, mig.version, mig.name, f.table); err != nil {
			return err
		}
	}
	var problem string
	if err := tx.QueryRow(ctx, m.check, f.schema, f.table).Scan(&problem); err != nil {
		return err
	}
	if problem != "" {
		return fmt.Errorf("%w: schema %q has a table %q that is not a fence table (%s); give the fence another table name (WithTable) or schema (WithSchema)",
			ErrInvalidOption, f.schema, f.table, problem)
	}
	return nil
}

// mayNotCreate adds to a refusal of CREATE (on the "database" for a
// missing schema, else on the "schema") what to do about it; other errors
// it returns as they are.
func (f *Fence) mayNotCreate(err error, on string) error {
	if !hasCode(err, sqlStateInsufficientPrivilege) {
		return err
	}
	grant := "GRANT CREATE ON SCHEMA " + pgx.Identifier{f.schema}.Sanitize()
	if on == "database" {
		grant = "GRANT CREATE ON DATABASE (this database)"
	}
	return fmt.Errorf("%w; Migrate has something to create and this role may not: run it once as the schema's owner "+
		"(or fenced admin pg-migrate --database-url with the owner's URL, or the script of fenced admin pg-sql through psql), "+
		"or %s TO this role; once the migrations are applied, Migrate needs no CREATE", err, grant)
}
