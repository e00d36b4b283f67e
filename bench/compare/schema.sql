-- The ledger of examples/ledger, one schema per scenario (the connection's
-- search_path names it), dropped at the end.

CREATE TABLE accounts (
	id              integer PRIMARY KEY,
	opening_balance bigint  NOT NULL,
	balance         bigint  NOT NULL,
	last_transfer   text    -- the transfer that wrote balance; NULL: the opening balance
);

-- One row per applied transfer, written in the same transaction as the
-- balances.
CREATE TABLE transfers (
	id           text    PRIMARY KEY,
	commit_seq   bigint  NOT NULL UNIQUE, -- commit order (see commit_order)
	worker       integer NOT NULL,
	holder       text    NOT NULL,        -- w<worker>#<acquisition>
	from_account integer NOT NULL REFERENCES accounts,
	to_account   integer NOT NULL REFERENCES accounts,
	amount       bigint  NOT NULL CHECK (amount > 0),
	from_prev    text,   -- last_transfer of each account as the writer read it
	to_prev      text,
	token        bigint  -- NULL for schemes without a token
);

-- One row; the last statement but one of every write increments it, which
-- row-locks it until COMMIT, so commit_seq is the commit order.
CREATE TABLE commit_order (
	one  boolean PRIMARY KEY DEFAULT true CHECK (one),
	last bigint  NOT NULL
);
INSERT INTO commit_order (last) VALUES (0);

-- The Postgres row-lock scheme's lock: SELECT ... FOR UPDATE of this row.
CREATE TABLE lock_rows (name text PRIMARY KEY);
INSERT INTO lock_rows (name) VALUES ('ledger');
