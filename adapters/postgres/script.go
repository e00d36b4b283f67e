package postgres

import (
	"fmt"
	"strconv"
	"strings"
)

// MigrationSQL returns the migrations of a [Fence] with the same options as
// one plain SQL script, for writers that do not run Go: feed it to psql,
// Flyway or Liquibase. fenced admin pg-sql prints it.
//
// The script applies exactly what [Fence.Migrate] applies, the same way: in
// one READ COMMITTED transaction it takes the advisory lock
// [MigrationLockKey], creates the schema if it is missing, reads the
// fence_schema_version table and runs each migration not recorded there,
// recording it. The rendered statements are Migrate's own, run by one DO
// block with EXECUTE. So the script is idempotent, safe to run at the same
// time as Migrate or another copy of itself, and a database migrated by
// either is up to date for the other. A schema that already holds a fence
// table of another name makes the script fail, as Migrate does.
//
// The script is BEGIN, one DO statement and COMMIT; it needs no psql
// meta-command. Tools that run each migration file in a READ COMMITTED
// transaction of their own (PostgreSQL's default level) may drop the BEGIN
// and COMMIT lines: the DO statement is atomic alone. At REPEATABLE READ or
// SERIALIZABLE its snapshot would predate the advisory lock and miss what
// another migrator applied meanwhile, so there it fails at once, saying so,
// and applies nothing.
//
// Options are those of [NewFence]: [WithSchema] (default "public") and
// [WithTable] (default "fence_tokens") name what is migrated, and
// [WithTxOptions] has no effect, as on Migrate. Invalid names and options
// are an error, the same as from NewFence.
func MigrationSQL(opts ...Option) (string, error) {
	c, err := fenceConfig(opts)
	if err != nil {
		return "", err
	}
	idents := fenceIdents(c.schema, c.table)
	m, err := renderMigrate(idents)
	if err != nil {
		return "", err
	}

	// Every statement sits in a dollar-quoted string of its own. Names may
	// not contain '$' (checkName), so only the embedded templates could
	// hold a tag; check them all.
	var b strings.Builder
	quote := func(tag, s string) (string, error) {
		tag = "$" + tag + "$"
		if strings.Contains(s, tag) {
			return "", fmt.Errorf("postgres: migration script: a statement contains the quote %s", tag)
		}
		return tag + s + tag, nil
	}
	q := map[string]*string{}
	stmts := []struct{ name, sql string }{
		{"readOnly", m.readOnly}, {"lock", m.lock}, {"schemaExists", m.schemaExists}, {"createSchema", m.createSchema},
		{"versionTableExists", m.versionTableExists}, {"versionTable", m.versionTable}, {"applied", m.applied}, {"record", m.record},
		{"check", m.check},
	}
	for _, s := range stmts {
		v, err := quote("fenced_sql", s.sql)
		if err != nil {
			return "", err
		}
		q[s.name] = &v
	}
	schemaLit, tableLit := quoteLiteral(c.schema), quoteLiteral(c.table)

	fmt.Fprintf(&b, `-- fenced: the Postgres fence's migrations for schema %s, fence table %s.
-- Rendered by fenced admin pg-sql (postgres.MigrationSQL): the statements
-- Fence.Migrate and fenced admin pg-migrate run, in the same way.
--
-- Idempotent, and safe to run at the same time as another migrator: one
-- transaction takes the advisory lock %d, creates the schema if it is
-- missing, and applies only the migrations not recorded in its table
-- %s.
-- Run it with: psql -v ON_ERROR_STOP=1 -f THIS_FILE
-- A tool that wraps each migration in its own READ COMMITTED transaction
-- (Flyway, Liquibase) may drop the BEGIN and COMMIT lines: the DO statement
-- is atomic on its own. At another isolation level it fails, changing nothing.
BEGIN ISOLATION LEVEL READ COMMITTED;

DO $fenced_migrate$
DECLARE
	schema_exists boolean;
	version_table_exists boolean;
	applied_version integer;
	applied_table text;
	applied integer[] := '{}';
	done integer := 0;
	problem text;
BEGIN
	-- At REPEATABLE READ or SERIALIZABLE the snapshot is taken before the
	-- lock, and misses the versions that a migrator holding it recorded.
	IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
		RAISE EXCEPTION 'postgres: the fence migrations must run at READ COMMITTED, not %%', upper(current_setting('transaction_isolation'))
			USING ERRCODE = 'invalid_transaction_state',
				HINT = 'Keep the script''s BEGIN ISOLATION LEVEL READ COMMITTED line, or have the tool run it at READ COMMITTED.';
	END IF;
	EXECUTE %s;
	EXECUTE %s
		USING %d::bigint;
	EXECUTE %s
		INTO schema_exists USING %s;
	IF NOT schema_exists THEN
		EXECUTE %s;
	END IF;
	EXECUTE %s
		INTO version_table_exists USING %s, %s;
	IF NOT version_table_exists THEN
		EXECUTE %s;
	END IF;
	FOR applied_version, applied_table IN EXECUTE %s LOOP
		IF applied_table <> %s THEN
			RAISE EXCEPTION 'postgres: schema %% already has the fence table %%, not %%; one fence table per schema',
				%s, applied_table, %s
				USING ERRCODE = 'invalid_parameter_value';
		END IF;
		applied := applied || applied_version;
	END LOOP;
`, strconv.Quote(c.schema), strconv.Quote(c.table), MigrationLockKey, versionTable,
		*q["readOnly"], *q["lock"], MigrationLockKey,
		*q["schemaExists"], schemaLit,
		*q["createSchema"],
		*q["versionTableExists"], schemaLit, quoteLiteral(versionTable),
		*q["versionTable"],
		*q["applied"],
		tableLit, schemaLit, tableLit)

	for _, mig := range m.migrations {
		tag := fmt.Sprintf("fenced_%04d", mig.version)
		body, err := quote(tag, mig.sql)
		if err != nil {
			return "", err
		}
		label := fmt.Sprintf("%04d_%s", mig.version, mig.name)
		fmt.Fprintf(&b, `
	-- Migration %s.
	IF NOT %d = ANY (applied) THEN
		EXECUTE %s;
		EXECUTE %s
			USING %d, %s, %s;
		RAISE NOTICE 'fenced: applied migration %s to schema %%', %s;
		done := done + 1;
	END IF;
`, label, mig.version, body, *q["record"], mig.version, quoteLiteral(mig.name), tableLit, label, schemaLit)
	}
	fmt.Fprintf(&b, `
	-- A table of the fence table's name that was there before is kept by
	-- CREATE TABLE IF NOT EXISTS, whatever its shape.
	EXECUTE %s
		INTO problem USING %s, %s;
	IF problem <> '' THEN
		RAISE EXCEPTION 'postgres: schema %% has a table %% that is not a fence table (%%); give the fence another table name or schema',
			%s, %s, problem
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
`, *q["check"], schemaLit, tableLit, schemaLit, tableLit)
	fmt.Fprintf(&b, `
	IF done = 0 THEN
		RAISE NOTICE 'fenced: schema %% is up to date (%d migrations)', %s;
	END IF;
END
$fenced_migrate$;

COMMIT;
`, len(m.migrations), schemaLit)
	return b.String(), nil
}

// quoteLiteral quotes s as an SQL string literal that means s whatever
// standard_conforming_strings is: with a backslash in s, as an E” string.
func quoteLiteral(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		q = "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q
}
