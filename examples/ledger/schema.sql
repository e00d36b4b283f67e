-- The ledger, created in its own schema (the connection's search_path) at
-- the start of each mode and dropped at the end.

-- Accounts with balances. A transfer writes the two balances it computed
-- from the balances it read (a read-modify-write, as an application that
-- computes in its own code does), and names itself in last_transfer.
CREATE TABLE accounts (
	id              integer PRIMARY KEY,
	opening_balance bigint  NOT NULL,
	balance         bigint  NOT NULL,
	last_transfer   text    -- the transfer that wrote balance; NULL: the opening balance
);

-- The transfers log: one row per applied transfer, written in the same
-- transaction as the balances.
CREATE TABLE transfers (
	id             text        PRIMARY KEY,
	commit_seq     bigint      NOT NULL UNIQUE, -- commit order (see commit_order)
	worker         integer     NOT NULL,
	from_account   integer     NOT NULL REFERENCES accounts,
	to_account     integer     NOT NULL REFERENCES accounts,
	amount         bigint      NOT NULL CHECK (amount > 0),
	from_prev      text,       -- last_transfer of each account as the writer read it
	to_prev        text,
	token          bigint,     -- the fencing token; NULL under the Redis-only lock
	acquired_at    timestamptz NOT NULL, -- when the writer's lock acquisition returned, by its clock
	lease_deadline timestamptz NOT NULL, -- end of the writer's lease validity, by its clock
	committed_at   timestamptz NOT NULL  -- clock_timestamp() at the last statement before COMMIT
);

-- One row. The last statement but one of every write transaction increments
-- it, which row-locks it until COMMIT, so commit_seq numbers the
-- transactions in the order they committed. It orders commits for the
-- check; it does not serialise read-modify-writes (the reads come before).
CREATE TABLE commit_order (
	one  boolean PRIMARY KEY DEFAULT true CHECK (one),
	last bigint  NOT NULL
);
INSERT INTO commit_order (last) VALUES (0);
