// Package postgres fences writes to PostgreSQL with pgx: a write carrying a
// fencing token is committed only if no write with a higher token has been
// admitted for the same resource, and the check is part of the write's own
// transaction.
//
// # Two ways to guard a write
//
// A [Fence] keeps a fence table, one row per resource with the highest token
// admitted for it (fence_tokens in schema public by default, created by
// [Fence.Migrate]). Its admit is an upsert that only advances the token:
//
//	INSERT INTO fence_tokens AS f (resource, token) VALUES ($1, $2)
//	ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
//	WHERE f.token <= EXCLUDED.token RETURNING f.token
//
// Use it when the resource is not one row: a set of rows, a whole table, a
// file named in the database, or anything named by a string. A Fence also
// implements [fence.Store] for callers that need only the check.
//
// A [Column] keeps the highest token on the guarded row itself, in a column
// fence_token bigint NOT NULL DEFAULT 0, and admits with
//
//	UPDATE t SET fence_token = $2 WHERE key = $1 AND fence_token <= $2
//
// Use it when the resource is one row of a table you own: it needs no other
// table, and the guard touches only the row that is written anyway. A write
// that SQL can express without reading first can carry the guard itself
// (AND fence_token <= $t, SET fence_token = $t) in a single statement; when
// such a statement affects no row, [Column.Rejected] tells a stale token
// from a missing row. A row is created carrying its creator's token (an
// INSERT … ON CONFLICT with the same guard; see [Column]): one inserted with
// the default 0 admits a stale holder, and one deleted forgets its token.
//
// Either way the admit is the first statement of the transaction and locks
// what it guards until the transaction ends, so a read-modify-write after it
// is serialised per resource: a check made before, and apart from, the write
// would let a stale writer slip in between. [Fence.InTx] and [Column.InTx]
// run a function in such a transaction and commit it; [Fence.AdmitTx] and
// [Column.AdmitTx] admit inside a transaction of yours. Tokens are admitted
// with >=: one holder may write many times with its token.
//
// Guard each resource with exactly one lock name. fenced may grant two
// different lock names the same token (they share one etcd transaction), so
// a resource written under two lock names could admit two holders at once;
// under one name every grant's token is unique and larger than the last.
//
// Keep the read and the write in that one transaction. If a holder reads in
// one transaction and writes in another, admit its token in both. Otherwise
// a newer holder may read before an older holder's late write lands; the
// late write is still admitted (no higher token has been admitted yet), and
// the newer holder's write, computed from what it read, undoes it.
// examples/ledger shows the case.
//
// # Cost
//
// An admit made as the first statement costs one statement more per
// transaction, a round trip to the server, whatever the guard does; for a
// transaction of one short UPDATE that is a large share (bench/pgfence in
// this repository measures it against the same UPDATE unguarded). A write
// that carries the column guard in its own UPDATE, checked with
// [Column.Rejected], costs next to nothing. [Fence.Admit] outside a write
// is a single statement.
//
// # Errors
//
// A stale token is a [*fence.StaleError], which matches [fence.ErrStale] and
// carries the highest token admitted. A row that a Column cannot find matches
// [ErrNoRow], and is not stale. A zero token, or one above math.MaxInt64
// (tokens are stored as bigint), matches [fence.ErrInvalidToken]; a resource
// name or a Column's text key that PostgreSQL text cannot hold (a NUL byte,
// invalid UTF-8), or a resource name that
// is too long for the fence table's primary key (about 2,700 bytes, more only
// if the name compresses well; hash longer names), matches
// [fence.ErrInvalidResource], which [fence.Middleware] answers 400, not 503.
// Names of schemas, tables and columns are quoted as identifiers, never
// pasted into SQL; an unusable name or option is an error from [NewFence] or
// [NewColumn]. A table of the fence table's name that is not a fence table,
// or a fence column that is not bigint NOT NULL, made before for something
// else, is an error from [Fence.Migrate] or [Column.AddColumn] matching
// [ErrInvalidOption], not a success followed by failing admits.
//
// An error of a setup that cannot work says what to do, and keeps the
// server's *pgconn.PgError for errors.As: a fence table that is missing
// (SQLSTATE 42P01; run [Fence.Migrate], or fenced admin pg-migrate), a
// Column's fence column that is missing (42703; [Column.AddColumn], or
// [WithFenceColumn] to name the column the table has), a Column's table in
// a schema other than public (42P01; [WithSchema]: the table is named with
// its schema, never looked up along search_path), and a read-only server
// (25006; a hot-standby replica, or default_transaction_read_only: connect
// to the primary). Migrate refuses a read-only transaction too (25006),
// even when every migration is applied.
//
// # Other languages
//
// Migrate also installs the SQL function fence_admit(resource text, token
// bigint) returns bigint, in the Fence's schema, over the same fence table.
// Writers in any language get the same check by calling it as the first
// statement of their own transaction:
//
//	BEGIN;
//	SELECT fence_admit('invoice-42', 1234);
//	UPDATE invoices SET ... WHERE id = 42;
//	COMMIT;
//
// It returns the new highest token. A stale token raises SQLSTATE SF001
// ([SQLStateStale]; class SF is left to implementations by the SQL standard
// and unused by PostgreSQL) with the message
//
//	fence: stale token 7 for "invoice-42": highest admitted is 9
//
// and the detail "token=7 highest=9 resource=invoice-42". [MapError] turns
// that error into a [*fence.StaleError] on the Go side; the InTx methods
// apply it to what their function returns.
//
// # Isolation levels
//
// The guard is correct under READ COMMITTED, the default, and under
// REPEATABLE READ and SERIALIZABLE (set with [WithTxOptions], or begin the
// transaction yourself). Under READ COMMITTED, an admit that waits for a
// concurrent admit of the same resource rechecks the token against the
// committed row. Under REPEATABLE READ and SERIALIZABLE it fails instead
// with a serialization failure (SQLSTATE 40001), as can the commit. The
// InTx methods do not retry: the function may have done things outside the
// database that must not be done twice. They roll back and return the error
// wrapped; [IsRetryable] reports whether running the whole transaction
// again may succeed: after a serialization failure or a deadlock (40001,
// 40P01), a lock_timeout or statement_timeout (55P03, 57014; an admit
// waits for the row lock of a concurrent writer of the resource), and a
// session that ended before COMMIT was sent; never when the caller's
// context ended, nor after [ErrCommitUnknown]. A COMMIT that was sent and
// got no answer (the connection lost, the context ended), or whose session
// was ended while it ran, by PostgreSQL (an error of severity FATAL or
// PANIC) or by a pooler (PgBouncer's own errors, SQLSTATE 08P01, when it
// loses the server connection or its query_timeout fires), matches
// [ErrCommitUnknown]: the server may have applied it, and the fence, which
// admits a holder's token again, cannot stop the write from being applied
// twice if it is run again. Read what it changed first, or make it
// idempotent. An ERROR answering the COMMIT, a session that ended before
// COMMIT was sent, a COMMIT never sent because the context had ended, and
// one never sent because the function left rows open (close them before
// returning), are rollbacks.
//
// # Connection poolers
//
// A pooler in transaction mode, such as PgBouncer with pool_mode =
// transaction, hands each transaction whichever server connection is free,
// so nothing session-scoped carries from one transaction to the next. The
// guard needs nothing of the kind: the admit, its row lock and the
// migrations' advisory lock (pg_advisory_xact_lock) all live and end in
// their transaction. pgx's default query mode does not: its statement cache
// prepares named statements per connection, which the server connection
// then has twice or not at all (SQLSTATE 42P05 or 26000). Add
// default_query_exec_mode=exec, or simple_protocol, to the DSN (or set
// DefaultQueryExecMode in pgx's ConnConfig); this package's errors carry
// that advice when they meet those SQLSTATEs.
//
// A pooler in statement mode (PgBouncer with pool_mode = statement) allows
// no transaction of more than one statement: [Fence.InTx], [Column.InTx]
// and [Fence.Migrate] fail at BEGIN with PgBouncer's FATAL "transaction
// blocks not allowed in statement pooling mode" (SQLSTATE 08P01), and
// nothing can guard a write there. [Fence.Admit] alone, one statement,
// still works, but it is only a check: a stale holder can write between it
// and the write. Give the guarded writes a pool in transaction or session
// mode, and run Migrate through it, or directly against the server.
//
// # Migrations
//
// [Fence.Migrate] applies the versioned SQL files embedded in this package,
// each once, in one transaction under the advisory lock [MigrationLockKey],
// and records them in the table fence_schema_version; it is safe to run at
// every start, from many processes at once. Once they are applied it creates
// nothing, so the role that writes may run it with no CREATE privilege (USAGE
// on the schema and SELECT, INSERT and UPDATE on its tables); the first run
// needs a role that may create in the schema, such as its owner (fenced
// admin pg-migrate, or the script of fenced admin pg-sql, does it apart from
// the application). A schema holds one fence table, because it holds one
// fence_admit function.
package postgres
