// The client over https, against a real fenced serve with TLS on: its
// certificate signed by a CA the test makes with the openssl command.

import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import tls from "node:tls";

import { Client, CertificateError, TransportError } from "../src/index.js";
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

/**
 * An undici Agent (a fetch dispatcher) that trusts ca, as a user makes one
 * with `new Agent({ connect: { ca } })` from the undici package. The test
 * adds no dependency: it takes the Agent class of Node's own fetch, from
 * its global dispatcher, there once fetch has been used.
 */
async function agentTrusting(ca: string): Promise<object> {
  await fetch("http://127.0.0.1:1/").catch(() => {}); // loads Node's undici, which sets its global dispatcher
  const global = (globalThis as Record<symbol, unknown>)[Symbol.for("undici.globalDispatcher.1")] as object;
  const Agent = global.constructor as new (o: object) => object;
  return new Agent({ connect: { ca: readFileSync(ca) } });
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
