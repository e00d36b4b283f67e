// Review fixes, against a real fenced (fenced dev): a Retry-After of 0 (or
// negative, or not a whole number) counts as none, and the keep-alive
// pauses at least min(ttl/10, 1 s) after a failure, as the Go client's;
// base URLs with a user, a query or a fragment are refused, as the Go
// client refuses them; a 200 answer to an acquire, campaign or refresh that
// lacks lease_id, token or ttl_ms is an error that says so.

import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer, request as httpRequest } from "node:http";
import { once } from "node:events";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, FencedError, UnavailableError } from "../src/index.js";
import { Daemon, unique } from "./daemon.js";

/**
 * A proxy in front of the fenced at target, in state.mode: "pass" forwards;
 * "503" answers every request itself with 503, an HTML page and
 * Retry-After: state.retryAfter (a load balancer whose upstreams are away);
 * "empty" answers every request itself with 200 and state.body (the JSON
 * object {} by default), as a wrong base URL or a proxy might. counts maps
 * the last path segment ("acquire", "refresh", …) to the requests it did
 * not forward.
 */
async function startProxy(target: string) {
  const t = new URL(target);
  const counts = new Map<string, number>();
  const state = { mode: "pass", retryAfter: "0", body: "{}" };
  const server = createServer((req, res) => {
    if (state.mode !== "pass") {
      const key = new URL(req.url!, "http://x").pathname.split("/").pop()!;
      counts.set(key, (counts.get(key) ?? 0) + 1);
    }
    if (state.mode === "503") {
      req.resume();
      res.writeHead(503, { "Retry-After": state.retryAfter, "Content-Type": "text/html" });
      res.end("<html><body>503 Service Unavailable</body></html>");
      return;
    }
    if (state.mode === "empty") {
      req.resume();
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(state.body);
      return;
    }
    const up = httpRequest({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers: req.headers }, (ur) => {
      res.writeHead(ur.statusCode!, ur.headers);
      ur.pipe(res);
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    state,
    counts,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

describe("review fixes (fenced dev)", () => {
  let daemon: Daemon;
  before(async () => {
    daemon = await Daemon.start("dev");
  });
  after(async () => {
    await daemon.stop();
  });

  it("counts a Retry-After that is not a whole number of seconds above 0 as none, as the Go client does", async () => {
    // "0" made every caller that honours it (the keep-alive, send's
    // retries) go again at once.
    const p = await startProxy(daemon.url);
    try {
      const client = new Client(p.url, { retries: 0 });
      p.state.mode = "503";
      for (const [ra, want] of [["0", undefined], ["-1", undefined], ["abc", undefined], ["1.5", undefined], ["", undefined], ["1", 1000], ["2", 2000]] as const) {
        p.state.retryAfter = ra;
        const err = await client.tryAcquire(unique(), { ttlMs: 5000 }).then(
          () => undefined,
          (e: unknown) => e,
        );
        assert.ok(err instanceof UnavailableError, `Retry-After: ${JSON.stringify(ra)}: ${String(err)}`);
        assert.equal(err.retryAfterMs, want, `Retry-After: ${JSON.stringify(ra)}`);
      }
    } finally {
      p.close();
    }
  });

  it("keep-alive: a 503 with Retry-After: 0 is no busy loop", async () => {
    // The keep-alive pauses at least min(ttl/10, 1 s) = 300 ms after each
    // failed refresh of a 3 s lease, as the Go client's: at most 3 s /
    // 300 ms + 1 = 11 refreshes before its validity runs out. Before, it
    // refreshed in a busy loop (some 440 times).
    const p = await startProxy(daemon.url);
    try {
      const client = new Client(p.url);
      const lease = await client.acquire(unique(), { ttlMs: 3000, waitMs: 0 });
      p.state.mode = "503";
      lease.keepAlive();
      await Promise.race([lease.lost, sleep(6000)]);
      await lease.stopKeepAlive();
      assert.ok(lease.signal.aborted, "lease not lost");
      const n = p.counts.get("refresh") ?? 0;
      assert.ok(n >= 2 && n <= 15, `${n} refreshes of a 3 s lease: a busy loop`);
    } finally {
      p.close();
    }
  });

  it("waiting acquire: a 503 with Retry-After: 0 is no busy loop", async () => {
    // The wait's back-off, 50 ms doubling to 1 s (as the Go client's):
    // requests at 0, 50, 150, 350, 750 and 1550 ms, so 6 in a 2 s wait.
    const p = await startProxy(daemon.url);
    try {
      const client = new Client(p.url);
      p.state.mode = "503";
      await assert.rejects(client.acquire(unique(), { ttlMs: 3000, waitMs: 2000 }), UnavailableError);
      const n = p.counts.get("acquire") ?? 0;
      assert.ok(n >= 2 && n <= 12, `${n} requests in a 2 s wait: a busy loop`);
    } finally {
      p.close();
    }
  });

  it("rejects an acquire or campaign answer without lease_id, token or ttl_ms, as the Go client does", async () => {
    // A 200 with {} (a wrong base URL, a proxy) made a Lease with
    // undefined fields (name, leaseID, token, ttlMs: a deadline of NaN).
    const p = await startProxy(daemon.url);
    try {
      const client = new Client(p.url);
      p.state.mode = "empty";
      const bodies = [
        "{}",
        '{"name":"x","token":5,"ttl_ms":1000}',
        '{"lease_id":"","token":5,"ttl_ms":1000}',
        '{"lease_id":"ab","ttl_ms":1000}',
        '{"lease_id":"ab","token":0,"ttl_ms":1000}',
        '{"lease_id":"ab","token":5}',
        '{"lease_id":"ab","token":5,"ttl_ms":0}',
        '{"lease_id":"ab","token":5,"ttl_ms":true}',
      ];
      for (const body of bodies) {
        p.state.body = body;
        for (const waitMs of [0, 500]) {
          const name = unique();
          const err = await client.acquire(name, { ttlMs: 1000, waitMs }).then(
            (l) => l,
            (e: unknown) => e,
          );
          assert.ok(err instanceof FencedError && err.constructor === FencedError, `${body}, waitMs ${waitMs}: ${String(err)}`);
          assert.equal(err.message, `acquire ${JSON.stringify(name)}: the server's answer lacks lease_id, token or ttl_ms`);
        }
      }
      p.state.body = "{}";
      const name = unique();
      await assert.rejects(client.elect(name, { waitMs: 0 }), {
        constructor: FencedError,
        message: `campaign ${JSON.stringify(name)}: the server's answer lacks lease_id, token or ttl_ms`,
      });
      assert.equal(p.counts.get("acquire"), 2 * bodies.length, "an answer that is no lease was sent again, or ridden out");
    } finally {
      p.close();
    }
  });

  it("rejects a refresh answer without token or ttl_ms, and loses nothing", async () => {
    // A refresh answered {} said "lost" (its token undefined is not the
    // lease's). As the Go client: an error that says so, the lease not
    // lost, and a refresh that may have been applied.
    const p = await startProxy(daemon.url);
    try {
      const client = new Client(p.url, { retries: 0 });
      const name = unique();
      const lease = await client.acquire(name, { ttlMs: 30_000, waitMs: 0 });
      p.state.mode = "empty";
      for (const body of ["{}", `{"token":${lease.token}}`, '{"ttl_ms":30000}']) {
        p.state.body = body;
        await assert.rejects(lease.refresh(), (e: unknown) => {
          assert.ok(e instanceof FencedError && e.constructor === FencedError, `${body}: ${String(e)}`);
          assert.equal(e.message, `refresh ${JSON.stringify(name)}: the server's answer lacks token or ttl_ms`);
          return true;
        });
        assert.ok(!lease.signal.aborted, `${body}: lost: ${String(lease.signal.reason)}`);
        assert.ok(lease.validForMs() > 20_000);
      }
      p.state.mode = "pass";
      await lease.refresh();
      await lease.release();
    } finally {
      p.close();
    }
  });
});

it("refuses base URLs with a user, a query or a fragment, as the Go client does, and shows no password", () => {
  // new Client took them: with user:password@ every request failed in
  // fetch (a retryable TransportError, so a waiting acquire rode it out
  // for its whole wait and then printed the password); with ?query or
  // #fragment every request went to "/" (a 404). The password shows as
  // "xxxxx", as Go's url.URL.Redacted shows it.
  for (const [url, shown] of [
    ["http://user@127.0.0.1:7070", "http://user@127.0.0.1:7070"],
    ["http://user:s3cret@127.0.0.1:7070", "http://user:xxxxx@127.0.0.1:7070"],
    ["https://user:s3:c@r@et@fenced.example/prefix", "https://user:xxxxx@fenced.example/prefix"],
    ["http://@127.0.0.1:7070", "http://@127.0.0.1:7070"],
    ["http://:s3cret@127.0.0.1:7070", "http://:xxxxx@127.0.0.1:7070"],
    ["http://127.0.0.1:7070?q", "http://127.0.0.1:7070?q"],
    ["http://127.0.0.1:7070/prefix?x=1", "http://127.0.0.1:7070/prefix?x=1"],
    ["http://127.0.0.1:7070?", "http://127.0.0.1:7070?"],
    ["http://127.0.0.1:7070#f", "http://127.0.0.1:7070#f"],
    ["http://127.0.0.1:7070#", "http://127.0.0.1:7070#"],
  ]) {
    assert.throws(() => new Client(url), (e: unknown) => {
      assert.ok(e instanceof TypeError, `${url}: ${String(e)}`);
      assert.equal(e.message, `baseURL ${JSON.stringify(shown)}: want no user, query or fragment`);
      assert.ok(!e.message.includes("s3"), e.message);
      return true;
    });
  }
  // Nor does a URL refused for another reason show its password.
  for (const url of ["http://user:s3cret@127.0.0.1:99999", "ftp://user:s3cret@127.0.0.1:7070"]) {
    assert.throws(() => new Client(url), (e: unknown) => {
      assert.ok(e instanceof TypeError && !e.message.includes("s3cret"), String(e));
      return true;
    });
  }
  // What it takes still works: a path prefix.
  assert.equal(new Client("http://127.0.0.1:7070/prefix/").baseURL, "http://127.0.0.1:7070/prefix");
});
