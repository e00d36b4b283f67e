// forceRelease against a real fenced dev: with a token it releases only
// that grant and is safe to send again; without, a request that may have
// been applied (a 503, a lost answer) is not sent again.

import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer, request, type IncomingMessage, type ServerResponse } from "node:http";
import { once } from "node:events";
import type { Socket } from "node:net";

import {
  Client,
  FencedError,
  HeldByOtherError,
  HeldError,
  InvalidArgumentError,
  type Lease,
  MAX_TOKEN,
  RedirectError,
  TransportError,
  UnavailableError,
} from "../src/index.js";
import { Daemon, unique } from "./daemon.js";

/**
 * An HTTP proxy in front of target that forwards every request, but
 * answers the first DELETE with a failure after the server applied it: it
 * forwards the DELETE, awaits applied() (the test's next holder), then
 * answers 503 ("503") or destroys the connection without an answer
 * ("drop"). deletes() counts the DELETEs that reached the server.
 */
async function appliedThenFails(
  target: string,
  fail: "503" | "drop",
  applied: () => Promise<unknown>,
): Promise<{ url: string; deletes: () => number; firstStatus: () => number; close: () => Promise<void> }> {
  const { hostname, port } = new URL(target);
  let deletes = 0;
  let firstStatus = 0;
  const sockets = new Set<Socket>();
  const server = createServer(async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const up = request({ host: hostname, port: Number(port), method: req.method, path: req.url, headers: { ...req.headers, connection: "close" } });
    up.end(Buffer.concat(chunks));
    const [ur] = (await once(up, "response")) as [IncomingMessage];
    const body: Buffer[] = [];
    for await (const c of ur) body.push(c as Buffer);
    const first = req.method === "DELETE" && ++deletes === 1;
    if (first) {
      firstStatus = ur.statusCode ?? 0;
      await applied();
      if (fail === "drop") {
        req.socket.destroy();
        return;
      }
      const msg = '{"error":{"code":"unavailable","message":"lease store: context deadline exceeded"}}';
      res.writeHead(503, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(msg) }).end(msg);
      return;
    }
    const headers = { ...ur.headers };
    delete headers.connection;
    delete headers["transfer-encoding"];
    res.writeHead(ur.statusCode ?? 502, headers).end(Buffer.concat(body));
  });
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const addr = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${addr.port}`,
    deletes: () => deletes,
    firstStatus: () => firstStatus,
    close: async () => {
      for (const s of sockets) s.destroy();
      server.close();
      await once(server, "close");
    },
  };
}

/**
 * An HTTP server that answers every request with a redirect of status to
 * the same path and query on target, as an ingress that sends http:// to
 * https:// does.
 */
async function redirector(target: string, status: number): Promise<{ url: string; close: () => Promise<void> }> {
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on("end", () => res.writeHead(status, { Location: target + req.url, "Content-Length": "0" }).end());
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const addr = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${addr.port}`,
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, "close");
    },
  };
}

describe("forceRelease (fenced dev)", () => {
  let daemon: Daemon;
  let client: Client;
  before(async () => {
    daemon = await Daemon.start("dev");
    client = new Client(daemon.url);
  });
  after(() => daemon?.stop());

  /** name held, and another client waiting for it: next resolves to its lease once it holds the lock. */
  async function heldWithAWaiter(name: string): Promise<{ first: Lease; next: Promise<Lease> }> {
    const first = await client.acquire(name, { ttlMs: 30_000 });
    const next = new Client(daemon.url).acquire(name, { ttlMs: 30_000, waitMs: 20_000 });
    next.catch(() => {}); // awaited by the test; not unhandled meanwhile
    for (let i = 0; (await client.inspect(name)).waiters !== 1; i++) {
      assert.ok(i < 200, "the waiter never queued");
      await new Promise((r) => setTimeout(r, 50));
    }
    return { first, next };
  }

  /** Checks that next still holds name after the proxy's first DELETE, and returns its lease. */
  async function nextStillHolds(name: string, next: Promise<Lease>, p: { deletes: () => number; firstStatus: () => number }): Promise<Lease> {
    const l = await next;
    assert.equal(p.firstStatus(), 200, "the first DELETE did not release the lock");
    const st = await client.inspect(name);
    assert.ok(st.held && st.token === l.token, `the next holder (token ${l.token}) lost the lock: ${JSON.stringify(st, (_, v) => (typeof v === "bigint" ? String(v) : v))}; DELETEs that reached the server: ${p.deletes()}`);
    return l;
  }

  for (const fail of ["503", "drop"] as const) {
    it(`does not send an unconditional force-release again after ${fail === "503" ? "a 503" : "a lost answer"}`, async () => {
      // The server applied the force-release, then answered 503 (its backend
      // call timed out after it was done) or its answer was lost. Sent
      // again, the DELETE released the waiter the first one woke.
      const name = unique();
      const { next } = await heldWithAWaiter(name);
      const p = await appliedThenFails(daemon.url, fail, () => next);
      try {
        const c = new Client(p.url);
        await c.inspect(name); // a kept connection, as a client that was used before has
        const err = await c.forceRelease(name).then(
          (st) => assert.fail(`forceRelease answered ${st.held} token ${st.token}: it was sent again`),
          (e: unknown) => e,
        );
        const l = await nextStillHolds(name, next, p);
        assert.ok(err instanceof (fail === "503" ? UnavailableError : TransportError), String(err));
        assert.match((err as Error).message, /may have reached the server and released the lock/);
        // Its advice: a free lock has no token to force-release by.
        assert.match((err as Error).message, /inspect the lock to see whether it is held now/);
        assert.equal(p.deletes(), 1);
        await l.release();
      } finally {
        await p.close();
      }
    });

    it(`sends a force-release with a token again after ${fail === "503" ? "a 503" : "a lost answer"}, sparing the next holder`, async () => {
      const name = unique();
      const { first, next } = await heldWithAWaiter(name);
      const p = await appliedThenFails(daemon.url, fail, () => next);
      try {
        const c = new Client(p.url);
        const err = await c.forceRelease(name, { token: first.token }).then(
          (st) => assert.fail(`forceRelease answered ${st.held} token ${st.token}`),
          (e: unknown) => e,
        );
        const l = await nextStillHolds(name, next, p);
        assert.equal(p.deletes(), 2, "the conditional DELETE was not sent again");
        assert.ok(err instanceof HeldByOtherError && err instanceof HeldError, String(err));
        assert.equal((err as HeldByOtherError).token, l.token);
        assert.equal((err as HeldByOtherError).status, 409);
        await l.release();
      } finally {
        await p.close();
      }
    });
  }

  it("releases only the grant with the token given", async () => {
    const name = unique();
    const lease = await client.acquire(name, { ttlMs: 30_000, owner: "ts-stuck" });
    await assert.rejects(client.forceRelease(name, { token: lease.token + 1000n }), (e: unknown) =>
      e instanceof HeldByOtherError && e.token === lease.token && e.message.includes("nothing was released"));
    assert.equal((await client.inspect(name)).held, true);
    const st = await client.forceRelease(name, { token: lease.token });
    assert.deepEqual([st.held, st.token, st.owner], [true, lease.token, "ts-stuck"]);
    assert.equal((await client.forceRelease(name, { token: lease.token })).held, false);
    for (const bad of [0, -1n, 1.5, Number.MAX_SAFE_INTEGER + 1, MAX_TOKEN + 1n, "5" as unknown as bigint]) {
      await assert.rejects(client.forceRelease(name, { token: bad }), (e: unknown) =>
        e instanceof InvalidArgumentError && e.field === "token" && e.status === 0);
    }
  });

  it("force-releases by the token inspect shows as the README does, held or free", async () => {
    // The README's cheat sheet force-released by the token inspect showed,
    // right after a force-release that left the lock free: inspect of a
    // free lock shows token 0n, which no grant has, and the call rejected
    // with InvalidArgumentError without sending. It now looks at held
    // first, as this does; the error that says a force-release may have
    // been applied says so too.
    const name = unique();
    let lease = await client.acquire(name, { ttlMs: 30_000 });
    await client.forceRelease(name);
    for (const wantHeld of [false, true]) {
      if (wantHeld) lease = await client.acquire(name, { ttlMs: 30_000 });
      const { held, token } = await client.inspect(name);
      assert.equal(held, wantHeld);
      if (held) assert.equal((await client.forceRelease(name, { token })).token, lease.token);
      assert.equal((await client.inspect(name)).held, false);
    }
    const { token } = await client.inspect(name);
    await assert.rejects(client.forceRelease(name, { token }), InvalidArgumentError); // 0n: no grant
  });

  it("refuses a redirect, which fenced never sends, and applies nothing", async () => {
    // fetch follows redirects by default, and a 301 to 303 turns a DELETE
    // into a GET: fenced's inspect, whose state forceRelease returned as
    // its success, the lock still held (the Go client's package
    // documentation, "Errors").
    const name = unique();
    const lease = await client.acquire(name, { ttlMs: 30_000 });
    try {
      for (const status of [301, 302, 303, 307, 308]) {
        const r = await redirector(daemon.url, status);
        try {
          const c = new Client(r.url);
          for (const call of [() => c.forceRelease(name), () => c.forceRelease(name, { token: lease.token }),
            () => c.tryAcquire(name, { ttlMs: 30_000 }), () => c.inspect(name)]) {
            const err = await (call() as Promise<unknown>).then(
              (v) => assert.fail(`a call through a ${status} redirect returned ${JSON.stringify(v, (_, x) => (typeof x === "bigint" ? String(x) : x))}`),
              (e: unknown) => e,
            );
            assert.ok(err instanceof FencedError && err.status === status && err.code === undefined, String(err));
            assert.ok(err.message.includes(`point the client at ${daemon.url};`), err.message);
            assert.ok(!err.message.includes("may have"), err.message);
            assert.ok(err instanceof RedirectError && err.location.startsWith(`${daemon.url}/v1/locks/`) && !err.retryable, String(err));
          }
          const st = await client.inspect(name);
          assert.ok(st.held && st.token === lease.token, `after calls through a ${status} redirect the lock is held ${st.held}`);
        } finally {
          await r.close();
        }
      }
    } finally {
      await lease.release().catch(() => {}); // lost, if a call got through: the failure said so
    }
  });
});
