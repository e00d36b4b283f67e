// The client over https, against a real fenced serve with TLS on: its
// certificate signed by a CA the test makes with the openssl command.

import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, execFile } from "node:child_process";
import { copyFileSync, mkdtempSync, rmSync, writeFileSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import tls from "node:tls";
import https from "node:https";
import type { AddressInfo } from "node:net";

import { Client, CertificateError, ClientCertificateError, LostError, TransportError } from "../src/index.js";
import { Daemon, unique } from "./daemon.js";

/** A CA and a server certificate it signed for 127.0.0.1 (not localhost), valid for two days, in dir. */
function makeCerts(dir: string): { ca: string; cert: string; key: string } {
  const ca = join(dir, "ca.pem");
  const caKey = join(dir, "ca.key");
  const cert = join(dir, "server.pem");
  const key = join(dir, "server.key");
  const csr = join(dir, "server.csr");
  const ext = join(dir, "server.ext");
  writeFileSync(ext, "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n");
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  for (const args of [
    ["req", "-x509", ...ec, "-keyout", caKey, "-out", ca, "-days", "2", "-subj", "/CN=fenced test CA",
      "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"],
    ["req", "-new", ...ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
    ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", caKey, "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext],
  ]) {
    execFileSync("openssl", args, { stdio: "ignore" });
  }
  return { ca, cert, key };
}

/** A CA named name, valid for two days, in dir: its certificate and key files. */
function makeCA(dir: string, name: string): { cert: string; key: string } {
  const cert = join(dir, `${name}.pem`);
  const key = join(dir, `${name}.key`);
  execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
    "-out", cert, "-days", "2", "-subj", `/CN=fenced test ${name}`,
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"], { stdio: "ignore" });
  return { cert, key };
}

/** A certificate of a new key that ca signed with the extensions ext, valid for days from now (-1: expired a day ago), in dir. */
function issue(dir: string, ca: { cert: string; key: string }, name: string, ext: string, days = 2): { cert: string; key: string } {
  const cert = join(dir, `${name}.pem`);
  const key = join(dir, `${name}.key`);
  const csr = join(dir, `${name}.csr`);
  const extFile = join(dir, `${name}.ext`);
  writeFileSync(extFile, ext);
  execFileSync("openssl", ["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
    "-out", csr, "-subj", `/CN=${name}`], { stdio: "ignore" });
  execFileSync("openssl", ["x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial", "-out", cert,
    "-days", String(days), "-extfile", extFile], { stdio: "ignore" });
  return { cert, key };
}

const CLIENT_EXT = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";
const SERVER_EXT = "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n";

/**
 * An undici Agent (a fetch dispatcher) with these connect options (and
 * Agent options), as a user makes one with `new Agent({ connect: { ca,
 * cert, key } })` from the undici package. The test adds no dependency: it
 * takes the Agent class of Node's own fetch, from its global dispatcher,
 * there once fetch has been used.
 */
async function agentWith(connect: object, options: object = {}): Promise<object> {
  await fetch("http://127.0.0.1:1/").catch(() => {}); // loads Node's undici, which sets its global dispatcher
  const global = (globalThis as Record<symbol, unknown>)[Symbol.for("undici.globalDispatcher.1")] as object;
  const Agent = global.constructor as new (o: object) => object;
  return new Agent({ ...options, connect });
}

/** An undici Agent that trusts ca (see agentWith). */
async function agentTrusting(ca: string): Promise<object> {
  return agentWith({ ca: readFileSync(ca) });
}

/** Counts the TLS connections made while f runs (Node's fetch calls tls.connect for each). */
async function countHandshakes(f: () => Promise<unknown>): Promise<{ n: number; err: unknown }> {
  const connect = tls.connect;
  let n = 0;
  (tls as { connect: unknown }).connect = (...args: unknown[]) => {
    n++;
    return (connect as (...a: unknown[]) => unknown)(...args);
  };
  try {
    await f();
    return { n, err: undefined };
  } catch (err) {
    return { n, err };
  } finally {
    (tls as { connect: unknown }).connect = connect;
  }
}

describe("https (fenced serve --tls-cert)", () => {
  let daemon: Daemon;
  let dir: string;
  let ca: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "fenced-ts-tls-"));
    const c = makeCerts(dir);
    ca = c.ca;
    daemon = await Daemon.start("serve", "--lease-store", "etcd", "--etcd-data-dir", join(dir, "etcd"), "--etcd-unsafe-no-fsync",
      "--tls-cert", c.cert, "--tls-key", c.key);
  });
  after(async () => {
    await daemon?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("serves https", () => {
    assert.match(daemon.url, /^https:\/\/127\.0\.0\.1:/);
  });

  it("acquires, refreshes, keeps alive and releases with the CA trusted through a dispatcher", async () => {
    const client = new Client(daemon.url, { dispatcher: await agentTrusting(ca) });
    const name = unique();
    const lease = await client.acquire(name, { ttlMs: 3000, waitMs: 1000 });
    assert.equal((await client.inspect(name)).held, true);
    const token = lease.token;
    await lease.refresh(3000);
    assert.equal(lease.token, token);
    await lease.release();
    assert.equal((await client.inspect(name)).held, false);
    // The keep-alive: the lease outlives three of its TTLs.
    const kept = await client.lock(name, { ttlMs: 300 });
    assert.ok(kept.token > token);
    await sleep(900); // not a synchronisation: the time the lease is held for
    kept.check();
    assert.ok(kept.validForMs() > 0);
    await kept.release();
    assert.equal((await client.inspect(name)).held, false);
  });

  it("trusts the CA in NODE_EXTRA_CA_CERTS, with no option", async () => {
    const index = fileURLToPath(new URL("../src/index.js", import.meta.url));
    const script = `
      import { Client } from ${JSON.stringify(index)};
      const c = new Client(process.argv[1]);
      const lease = await c.acquire("${unique()}", { ttlMs: 3000 });
      await lease.refresh(3000);
      await lease.release();
      console.log("ok", lease.token);
    `;
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== "NODE_OPTIONS"));
    const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", script, daemon.url], {
      env: { ...env, NODE_EXTRA_CA_CERTS: ca },
      timeout: 60_000,
    });
    assert.match(stdout, /^ok \d+/);
  });

  it("fails at once, not retried, saying the certificate is not trusted and what to do", async () => {
    // A certificate the client does not trust is no transient failure: a
    // waiting acquire rode it out as one, a new handshake every 100 ms to
    // 1 s, until its wait was over, then rejected with a TransportError
    // (retryable) that said "unable to verify the first certificate".
    const client = new Client(daemon.url);
    const began = performance.now();
    const { n, err } = await countHandshakes(() => client.acquire(unique(), { waitMs: 20_000 }));
    const took = performance.now() - began;
    assert.ok(err instanceof CertificateError, `want a CertificateError, got ${String(err)}`);
    assert.ok(!(err instanceof TransportError));
    assert.equal(err.retryable, false);
    assert.equal(n, 1, "a certificate not trusted was tried again");
    assert.ok(took < 10_000, `the wait rode out a certificate not trusted: ${took} ms`);
    assert.match(err.message, /not trusted/);
    assert.match(err.message, /NODE_EXTRA_CA_CERTS|dispatcher/); // what to do
    assert.ok(err.message.includes(daemon.url), err.message);
    // The other calls alike: one attempt, a refresh and a release by id, an inspect.
    for (const call of [
      () => client.tryAcquire(unique()),
      () => client.refreshID(unique(), "0".repeat(32)),
      () => client.releaseID(unique(), "0".repeat(32)),
      () => client.inspect(unique()),
    ]) {
      const r = await countHandshakes(call);
      assert.ok(r.err instanceof CertificateError, `want a CertificateError, got ${String(r.err)}`);
      assert.equal(r.n, 1, "a certificate not trusted was tried again");
    }
  });

  it("a name the certificate does not hold: the same error", async () => {
    const client = new Client(daemon.url.replace("127.0.0.1", "localhost"), { dispatcher: await agentTrusting(ca) });
    await assert.rejects(client.inspect(unique()), (e: unknown) => {
      assert.ok(e instanceof CertificateError, `want a CertificateError, got ${String(e)}`);
      assert.match(e.message, /not trusted/);
      assert.match(e.message, /localhost/);
      return true;
    });
  });
});

describe("mutual TLS (fenced serve --tls-client-ca)", () => {
  let daemon: Daemon;
  let dir: string;
  let ca: { cert: string; key: string };
  let other: { cert: string; key: string };
  let server: { cert: string; key: string };
  let otherServer: { cert: string; key: string };
  let clientCert: { cert: string; key: string };
  // The files fenced serves, which a test swaps (and reloads with SIGHUP).
  let served: { cert: string; key: string; clientCA: string };

  function serve(cert: { cert: string; key: string }, clientCA: string): void {
    copyFileSync(cert.cert, served.cert);
    copyFileSync(cert.key, served.key);
    copyFileSync(clientCA, served.clientCA);
  }

  /** Serve cert and require client certificates of clientCA from the next handshake on (SIGHUP, then its log line). */
  async function reload(cert: { cert: string; key: string }, clientCA: string): Promise<void> {
    serve(cert, clientCA);
    const count = () => daemon.stderr.split("TLS certificate reloaded (SIGHUP)").length;
    const before = count();
    daemon.proc.kill("SIGHUP");
    const deadline = performance.now() + 20_000;
    while (count() <= before) {
      assert.ok(performance.now() < deadline, "fenced did not reload its certificate on SIGHUP");
      await sleep(20); // polling the log, with a deadline
    }
  }

  /** An Agent that trusts ca and presents cert, if given. */
  async function agent(cert?: { cert: string; key: string }, tls?: object, options?: object): Promise<object> {
    return agentWith({ ca: readFileSync(ca.cert), ...(cert ? { cert: readFileSync(cert.cert), key: readFileSync(cert.key) } : {}), ...tls }, options);
  }

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "fenced-ts-mtls-"));
    ca = makeCA(dir, "ca");
    other = makeCA(dir, "other-ca");
    server = issue(dir, ca, "server", SERVER_EXT);
    otherServer = issue(dir, other, "other-server", SERVER_EXT);
    clientCert = issue(dir, ca, "client", CLIENT_EXT);
    served = { cert: join(dir, "served.pem"), key: join(dir, "served.key"), clientCA: join(dir, "client-ca.pem") };
    serve(server, ca.cert);
    daemon = await Daemon.start("serve", "--lease-store", "etcd", "--etcd-data-dir", join(dir, "etcd"), "--etcd-unsafe-no-fsync",
      "--tls-cert", served.cert, "--tls-key", served.key, "--tls-client-ca", served.clientCA);
  });
  after(async () => {
    await daemon?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("a client certificate the server refuses fails at once, not retried, saying why and what to do", async () => {
    // A server that refuses the client's certificate refuses every
    // handshake alike. Under TLS 1.3 its alert comes after the request
    // was written, and fetch said "other side closed": a TransportError
    // taken for an answer lost, ridden out by a waiting acquire until its
    // wait was over, sent 3 times by the others, naming no certificate.
    const cases: [string, () => Promise<object>, RegExp, RegExp][] = [
      ["none", () => agent(), /tlsv13 alert certificate required/, /got none/],
      ["another CA's", () => agent(issue(dir, other, "other-client", CLIENT_EXT)), /tlsv1 alert unknown ca/, /does not trust the CA/],
      ["expired", () => agent(issue(dir, ca, "expired-client", CLIENT_EXT, -1)), /sslv3 alert certificate expired/, /valid now/],
      ["for servers", () => agent(server), /sslv3 alert bad certificate/, /client authentication/],
      ["none, TLS 1.2", () => agent(undefined, { maxVersion: "TLSv1.2" }), /sslv3 alert handshake failure/, /TLS 1\.2/],
    ];
    for (const [label, dispatcher, alert, advice] of cases) {
      const client = new Client(daemon.url, { dispatcher: await dispatcher() });
      const began = performance.now();
      const { n, err } = await countHandshakes(() => client.acquire(unique(), { waitMs: 20_000 }));
      const took = performance.now() - began;
      assert.ok(err instanceof ClientCertificateError, `${label}: want a ClientCertificateError, got ${String(err)}`);
      assert.ok(!(err instanceof TransportError) && !(err instanceof CertificateError), label);
      assert.equal(err.retryable, false);
      assert.ok(took < 10_000, `${label}: the wait rode out a refused client certificate: ${took} ms`);
      // The alert may reach the connection after undici ended the request
      // (1 in 100 or fewer): then one more attempt gets it.
      assert.ok(n <= 2, `${label}: a refused client certificate was tried ${n} times`);
      assert.match(err.message, /the server refused the client's TLS certificate/);
      assert.match(err.message, alert, label);
      assert.match(err.message, advice, label);
      assert.match(err.message, /dispatcher/); // what to do
      assert.ok(err.message.includes(daemon.url), err.message);
      for (const call of [
        () => client.tryAcquire(unique()),
        () => client.refreshID(unique(), "0".repeat(32)),
        () => client.releaseID(unique(), "0".repeat(32)),
        () => client.inspect(unique()),
        () => client.forceRelease(unique(), { token: 1n }),
        () => client.forceRelease(unique()),
      ]) {
        const r = await countHandshakes(call);
        assert.ok(r.err instanceof ClientCertificateError, `${label}: want a ClientCertificateError, got ${String(r.err)}`);
        assert.ok(r.n <= 2, `${label}: a refused client certificate was tried ${r.n} times`);
        assert.doesNotMatch(r.err.message, /may have/);
      }
    }
    // A certificate the server accepts.
    const client = new Client(daemon.url, { dispatcher: await agent(clientCert) });
    const name = unique();
    const lease = await client.acquire(name, { ttlMs: 3000, waitMs: 1000 });
    await lease.refresh(3000);
    await lease.release();
    assert.equal((await client.inspect(name)).held, false);
  });

  it("gives a kept-alive lease up at the first refresh refused on a certificate, saying the lock stays held", async () => {
    // The server's certificate rotated to another CA, or the client's no
    // longer accepted: no refresh will get through, and the keep-alive
    // retried until the lease's deadline, which it then said alone.
    for (const [label, cert, clientCA, want] of [
      ["server certificate rotated to another CA", () => otherServer, () => ca.cert, CertificateError],
      ["client certificate no longer accepted", () => server, () => other.cert, ClientCertificateError],
    ] as const) {
      // A connection a request (no keep-alive connections), and no TLS
      // session resumed (which skips the certificates): each refresh
      // after the change makes a whole handshake.
      const client = new Client(daemon.url, { dispatcher: await agent(clientCert, { maxCachedSessions: 0 }, { pipelining: 0 }) });
      const name = unique();
      const lease = await client.acquire(name, { ttlMs: 6000, waitMs: 1000 });
      try {
        await reload(cert(), clientCA());
        let lost: unknown;
        const { n } = await countHandshakes(async () => {
          lease.keepAlive(); // its first refresh: 2 s after the grant
          const giveUp = new AbortController();
          lost = await Promise.race([lease.lost, sleep(20_000, undefined, { signal: giveUp.signal }).catch(() => undefined)]);
          giveUp.abort();
        });
        assert.ok(lost instanceof LostError, `${label}: the lease was not lost (${String(lost)})`);
        assert.ok(lost.cause instanceof want, `${label}: lost at the deadline, not at the first refresh refused (${n} handshakes): ${lost.message}`);
        assert.match(lost.message, /stays held on the server until its TTL runs out/);
        assert.equal(n, 1, `${label}: the keep-alive tried again: ${lost.message}`);
        await assert.rejects(lease.release(), (e: unknown) => {
          assert.ok(e instanceof want, `${label}: release: ${String(e)}`);
          assert.match(e.message, /not released: the release cannot be sent/);
          return true;
        });
      } finally {
        await reload(server, ca.cert);
      }
      assert.equal((await client.inspect(name)).held, true, `${label}: the lock is not held on the server, as the loss said`);
      await assert.rejects(lease.release(), LostError); // released now, but it was lost before
      assert.equal((await client.inspect(name)).held, false);
    }
  });
});

describe("a certificate refused after a send (docs/design.md, defect 260)", () => {
  let daemon: Daemon;
  let dir: string;
  let ca: { cert: string; key: string };
  let server: { cert: string; key: string };
  let otherServer: { cert: string; key: string };
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "fenced-ts-sent-"));
    ca = makeCA(dir, "ca");
    server = issue(dir, ca, "server", SERVER_EXT);
    otherServer = issue(dir, makeCA(dir, "other-ca"), "other-server", SERVER_EXT);
    daemon = await Daemon.start("dev");
  });
  after(async () => {
    await daemon?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /** A server secure context of cert. */
  function serving(cert: { cert: string; key: string }): tls.SecureContextOptions {
    return { cert: readFileSync(cert.cert), key: readFileSync(cert.key) };
  }

  /**
   * An https front for the daemon (plain http) that serves cert. Once
   * armed, the first request whose path ends with cutOn it gets is passed
   * to fenced (applied), its
   * answer dropped with the connection, and every handshake from then on
   * gets then (a certificate of a CA the client does not trust), until
   * restore().
   */
  async function front(cert: tls.SecureContextOptions, then: tls.SecureContextOptions, cutOn = "/release") {
    const state = { armed: false, cut: false };
    const srv = https.createServer(cert, (req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", async () => {
        try {
          const body = chunks.length ? Buffer.concat(chunks) : undefined;
          const headers: Record<string, string> = {};
          if (req.headers["content-type"]) headers["Content-Type"] = req.headers["content-type"];
          const up = await fetch(daemon.url + req.url, { method: req.method, headers, body });
          const text = await up.text();
          if (state.armed && req.url?.endsWith(cutOn)) {
            state.armed = false;
            state.cut = true;
            srv.setSecureContext(then); // the next handshakes
            req.socket.destroy(); // fenced applied it; its answer is lost
            return;
          }
          res.writeHead(up.status, { "Content-Type": up.headers.get("content-type") ?? "" });
          res.end(text);
        } catch {
          req.socket.destroy();
        }
      });
    });
    await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
    return {
      url: `https://127.0.0.1:${(srv.address() as AddressInfo).port}`,
      state,
      restore: () => srv.setSecureContext(cert),
      close: () => {
        srv.closeAllConnections();
        return new Promise<void>((resolve) => srv.close(() => resolve()));
      },
    };
  }

  it("a release whose earlier attempt was applied is no release that cannot be sent, and no later loss", async () => {
    // The release reached fenced, which freed the lock; its answer was
    // lost and it was sent again, on a handshake that failed on the
    // server's certificate (rotated to another CA's). Before, release()
    // said the lock stayed held until its TTL, and, not counting the first
    // send as unanswered, a later release() answered "lost, maybe
    // released" rejected with LostError for the holder's own release.
    // (Only the server's certificate: Node's https server refuses a client
    // certificate by closing the connection, without the TLS alert fenced
    // sends, so the client could not tell it from a lost answer. The Python
    // client's test has that case too.)
    const plain = new Client(daemon.url);
    const f = await front(serving(server), serving(otherServer));
    try {
      // A connection a request (no keep-alive connections), and no TLS
      // session resumed (which skips the certificates): the release's
      // second attempt makes a whole handshake.
      const dispatcher = await agentWith({ ca: readFileSync(ca.cert), maxCachedSessions: 0 }, { pipelining: 0 });
      const client = new Client(f.url, { dispatcher });
      const name = unique();
      const lease = await client.acquire(name, { ttlMs: 30_000, waitMs: 1000 });
      f.state.armed = true;
      await assert.rejects(lease.release(), (e: unknown) => {
        assert.ok(e instanceof CertificateError, `release: ${String(e)}`);
        assert.doesNotMatch(e.message, /stays held|not released/);
        return true;
      });
      assert.ok(f.state.cut, "the release did not reach the front");
      assert.equal((await plain.inspect(name)).held, false, "the first send did not free the lock");
      // The server forgets the release id (another holder's releases
      // since); the holder calls release() again once the certificate is
      // fixed: its own first send freed the lock.
      f.restore();
      for (let i = 0; i < 16; i++) await (await plain.acquire(name, { ttlMs: 10_000, waitMs: 1000 })).release();
      await lease.release();
      assert.equal((await plain.inspect(name)).held, false);
    } finally {
      await f.close();
    }
  });

  it("a refresh whose earlier attempt was applied shortens the validity, though its last failed on a certificate", async () => {
    // A shorter refresh reached fenced, which applied it; its answer was
    // lost and it was sent again, on a handshake that failed on the
    // server's certificate. The lease ends as soon as that refresh may have
    // made it end (defect 114); before, it kept its whole validity.
    const f = await front(serving(server), serving(otherServer), "/refresh");
    try {
      const dispatcher = await agentWith({ ca: readFileSync(ca.cert), maxCachedSessions: 0 }, { pipelining: 0 });
      const lease = await new Client(f.url, { dispatcher }).acquire(unique(), { ttlMs: 30_000, waitMs: 1000 });
      f.state.armed = true;
      await assert.rejects(lease.refresh(2000), CertificateError);
      assert.ok(f.state.cut, "the refresh did not reach the front");
      assert.ok(lease.validForMs() <= 2000, `valid for ${lease.validForMs()} ms: not what the refresh applied may have left`);
    } finally {
      await f.close();
    }
  });
});
