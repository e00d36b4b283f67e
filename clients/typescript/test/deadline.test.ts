// Defect 169, against a real fenced (fenced dev): a lease whose deadline has
// passed says lost when asked, though the keep-alive's timer has not run
// since (here the event loop is held busy past the deadline, as a paused
// process would be, or the keep-alive is off): signal, lost, check() and
// validForMs() read the clock, and the first read past the deadline loses
// the lease (signal aborted, lost resolved, onLost called, once), as the Go
// client's Lease.Err does.

import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, Lease, LostError } from "../src/index.js";
import { Daemon, unique } from "./daemon.js";

/** Holds the event loop (no timer runs) until past lease's deadline. */
function busyPast(lease: Lease, extraMs = 20): void {
  const until = lease.deadline + extraMs;
  while (performance.now() < until) {
    // busy: the keep-alive's timer cannot run
  }
}

describe("a lease past its deadline (fenced dev)", () => {
  let daemon: Daemon;
  let client: Client;
  before(async () => {
    daemon = await Daemon.start("dev");
    client = new Client(daemon.url);
  });
  after(() => daemon?.stop());

  it("signal is aborted at the first read past the deadline, with the keep-alive's timer held off", async () => {
    const lease = await client.acquire(unique(), { ttlMs: 1000 });
    const calls: LostError[] = [];
    lease.keepAlive({ onLost: (_l, err) => void calls.push(err) });
    const early = lease.signal; // taken before: aborted with the lease
    busyPast(lease);
    const past = performance.now() - lease.deadline;
    assert.equal(early.aborted, false, "the keep-alive ran during a busy loop?");
    assert.equal(lease.signal.aborted, true, `signal.aborted ${past.toFixed(0)} ms past the deadline: false`);
    assert.ok(lease.signal.reason instanceof LostError);
    assert.match(String(lease.signal.reason.message), /no successful refresh before its validity ran out/);
    assert.equal(early.aborted, true, "the signal taken before was not aborted with it");
    assert.deepEqual(calls, [lease.signal.reason], "onLost not called once, synchronously");
    assert.equal(await lease.lost, lease.signal.reason);
    await lease.stopKeepAlive();
    assert.equal(calls.length, 1, "onLost called again by the keep-alive");
    assert.throws(() => lease.check(), LostError);
    assert.equal(lease.validForMs(), 0);
    await assert.rejects(lease.release(), LostError); // lost before: writes under it may have overlapped
  });

  it("check() loses the lease", async () => {
    const lease = await client.acquire(unique(), { ttlMs: 1000 });
    lease.keepAlive();
    busyPast(lease);
    let thrown: unknown;
    assert.throws(() => {
      try {
        lease.check();
      } catch (e) {
        thrown = e;
        throw e;
      }
    }, LostError);
    assert.equal(lease.signal.aborted, true);
    assert.equal(lease.signal.reason, thrown, "check() threw another error than the loss");
    await lease.stopKeepAlive();
    await assert.rejects(lease.release(), LostError);
  });

  it("validForMs() loses the lease", async () => {
    const lease = await client.acquire(unique(), { ttlMs: 1000 });
    const early = lease.signal; // read now: a read past the deadline would check the clock itself
    busyPast(lease);
    assert.equal(early.aborted, false);
    assert.equal(lease.validForMs(), 0);
    assert.equal(early.aborted, true, "validForMs() said 0, the lease not lost");
    await assert.rejects(lease.release(), LostError);
  });

  it("lost resolves when read past the deadline, keep-alive off", async () => {
    const lease = await client.acquire(unique(), { ttlMs: 300 });
    await sleep(Math.max(0, lease.deadline - performance.now()) + 20);
    const won = await Promise.race([lease.lost.then((e) => e), sleep(2000).then(() => undefined)]);
    assert.ok(won instanceof LostError, "lost read past the deadline did not resolve");
    await assert.rejects(lease.release(), LostError);
  });

  it("a lease before its deadline is held", async () => {
    const lease = await client.acquire(unique(), { ttlMs: 5000 });
    assert.equal(lease.signal.aborted, false);
    lease.check();
    assert.ok(lease.validForMs() > 0);
    await lease.release();
  });

  it("a released lease past its deadline stays unaborted", async () => {
    const lease = await client.acquire(unique(), { ttlMs: 300 });
    await lease.release();
    await sleep(Math.max(0, lease.deadline - performance.now()) + 20);
    assert.equal(lease.signal.aborted, false);
    assert.throws(() => lease.check(), /released/);
    assert.equal(lease.validForMs(), 0);
    assert.equal(lease.signal.aborted, false);
  });
});
