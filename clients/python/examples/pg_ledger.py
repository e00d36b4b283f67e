"""A Python writer fenced in Postgres: take a lock from fenced, then write
in a transaction whose first statement is fence_admit(resource, token).

Writer A takes the lock, reads a balance, and pauses (think GC, swap or
SIGSTOP) past its lease's TTL. Writer B gets the lock with a larger token and
writes. A wakes up and writes what it had planned: Postgres rejects it with
SQLSTATE SF001, so B's update is not lost.

Needs a fenced (FENCED_URL, default http://127.0.0.1:7070, e.g. fenced dev)
and the fence installed in Postgres (DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/test) in --schema, with psql alone:

    fenced admin pg-sql --schema public | psql -v ON_ERROR_STOP=1 "$DATABASE_URL"
    /usr/bin/python3 examples/pg_ledger.py --schema public

psycopg 3 comes from Debian's python3-psycopg. Exits 0 when the stale write
was rejected and the balance is B's.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

import psycopg
from psycopg import sql

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fenced  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fenced-url", default=os.environ.get("FENCED_URL", "http://127.0.0.1:7070"))
    ap.add_argument("--database-url", default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--schema", default="public", help="schema of fence_admit (fenced admin pg-sql --schema)")
    args = ap.parse_args()

    client = fenced.Client(args.fenced_url)
    account = f"account-{uuid.uuid4().hex[:8]}"  # the resource, and the lock's name
    schema = sql.Identifier(args.schema)
    admit = sql.SQL("SELECT {}.fence_admit(%s, %s)").format(schema)
    accounts = sql.SQL("{}.example_accounts").format(schema)

    with psycopg.connect(args.database_url, autocommit=True) as db:
        db.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, balance bigint NOT NULL)").format(accounts))
        db.execute(sql.SQL("INSERT INTO {} VALUES (%s, 100)").format(accounts), (account,))

        def withdraw(who: str, token: int, amount: int, planned: int | None = None) -> int:
            """One transaction: admit the token first, then read and write.
            planned is a balance read earlier, outside the transaction."""
            with db.transaction():
                db.execute(admit, (account, token))  # locks the fence row until commit
                (balance,) = db.execute(sql.SQL("SELECT balance FROM {} WHERE id = %s FOR UPDATE").format(accounts), (account,)).fetchone()
                new = (planned if planned is not None else balance) - amount
                db.execute(sql.SQL("UPDATE {} SET balance = %s WHERE id = %s").format(accounts), (new, account))
            print(f"writer {who}: balance {planned if planned is not None else balance} -> {new}, committed with token {token}")
            return new

        a = client.acquire(account, ttl_ms=1000)
        print(f"writer A: lock {account!r}, token {a.token}, ttl {a.ttl_ms} ms")
        (planned,) = db.execute(sql.SQL("SELECT balance FROM {} WHERE id = %s").format(accounts), (account,)).fetchone()
        print(f"writer A: read balance {planned}, will withdraw 30 ... and pauses past its TTL (GC, swap, SIGSTOP)")

        # B waits for A's lease to expire (A does not refresh: it is paused).
        with client.lock(account, ttl_ms=10_000, wait_ms=30_000) as b:
            print(f"writer B: lock {account!r}, token {b.token} (A's lease expired)")
            withdraw("B", b.token, 50)

        print(f"writer A: wakes up and writes balance {planned - 30} with token {a.token}")
        rejected = False
        try:
            withdraw("A", a.token, 30, planned=planned)
        except psycopg.Error as e:
            if e.sqlstate != "SF001":
                raise
            rejected = True
            print(f"writer A: REJECTED by Postgres, SQLSTATE {e.sqlstate}: {e.diag.message_primary}")

        (final,) = db.execute(sql.SQL("SELECT balance FROM {} WHERE id = %s").format(accounts), (account,)).fetchone()
        db.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(accounts), (account,))
    ok = rejected and final == 50
    verdict = "B's withdrawal kept, A's stale write rejected" if ok else "WRONG: a lost update"
    print(f"final balance {final}: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
