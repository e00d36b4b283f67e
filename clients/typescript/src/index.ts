/**
 * Client of fenced's HTTP API (v1): leases with fencing tokens. Node 20 or
 * later, no runtime dependencies (global fetch, AbortSignal, timers).
 *
 * ```ts
 * import { Client } from "@fenced/client";
 * const client = new Client("http://127.0.0.1:7070");
 * await client.withLock("invoice-42", { ttlMs: 10_000 }, async (lease) => {
 *   await write(lease.token, { signal: lease.signal }); // aborted once the lease is lost
 * });
 * ```
 *
 * Tokens are `bigint`: they are integers up to 2^63−1, past what a JavaScript
 * number holds exactly (2^53). The client reads them from the response's raw
 * text, never through a double.
 *
 * Errors are typed by the API's error code, never by message text:
 * HeldError (409 held; its subclass TTLTooShortError, a 503 on ttl_ms: not
 * acquired, nobody holds the lock), OutOfOrderError (409 out_of_order),
 * LostError (410 lost), InvalidArgumentError (400), …, all FencedError.
 * UnavailableError (503) and TransportError (no answer) are retryable.
 *
 * Every acquire or campaign sends a waiter, 32 lowercase hex digits drawn once per
 * call: the key to a grant whose answer was lost, and a fair waiting call's
 * place in the server's queue (one attempt, waitMs 0, and an unfair acquire
 * have none). Such a call is asked again, with the same
 * waiter, after a 503, after its answer was lost (the connection closed or
 * reset once the request was sent), or after an answer that is not fenced's
 * decision (a proxy's 502 or 504 page, a 500, a body that is not JSON:
 * docs/design.md, defect 119): the server hands back the grant it made
 * for that waiter, the same lease id and token, instead of leaving a lease
 * nobody knows to hold the lock until its TTL. A waiting call (waitMs > 0)
 * rides out every failure without fenced's decision (a refused connection
 * and a timeout too) until its wait ends, not `retries` times: a fenced
 * restarting does not end a 30 s wait (docs/design.md, defect 130). A
 * request asked again waits only what is left of waitMs: the call as a
 * whole waits no longer than it was asked to (but for one last request, at
 * once and with wait_ms 1, after an answer lost, or not fenced's, when the
 * wait is over: it may have been a grant). One attempt is asked again up to
 * `retries` times. A fair wait whose signal aborts gives its place up
 * with one more request before it rejects (docs/design.md, defect 134).
 */

import { randomBytes } from "node:crypto";
import { subscribe } from "node:diagnostics_channel";
import { setTimeout as sleep } from "node:timers/promises";

/** The HTTP header that carries a fencing token to a protected resource, in decimal (docs/fencing-token-http.md). */
export const FENCING_TOKEN_HEADER = "Fencing-Token";

/** The largest token fenced issues: 2^63−1, what a signed 64-bit integer or a Postgres bigint holds. */
export const MAX_TOKEN = (1n << 63n) - 1n;

/** The longest owner label, in bytes of UTF-8 (API schema Label). */
export const MAX_LABEL_BYTES = 128;

// ---------------------------------------------------------------------------
// Errors

/** An error answer of the API, or no answer (status 0). */
export class FencedError extends Error {
  /** The API's error code ("held", "lost", …), or undefined when the answer was not an API error. */
  readonly code: string | undefined;
  /** The HTTP status; 0 without an answer. */
  readonly status: number;
  /**
   * Milliseconds the server asked to wait before retrying (Retry-After: a
   * whole number of seconds above 0, as the Go client takes it), if it did;
   * a Retry-After of 0, negative, a fraction or a date counts as none.
   */
  readonly retryAfterMs: number | undefined;
  /** The request field the server refused ("wait_ms", "ttl_ms", …), if it named one. */
  field: string | undefined;
  /** On a refused wait_ms, the longest wait the server allows (its --max-wait; API field max_wait_ms). */
  maxWaitMs: number | undefined;
  /**
   * On the HeldError that ends a wait (acquire, elect with waitMs): how long
   * the call waited, in milliseconds, from its start to the 409, across all
   * its requests (a wait longer than the server's --max-wait takes
   * several), as the Go client's lock.WaitError; and its place in the lock's
   * queue then, as the last 409 that had one said (API fields waited_ms,
   * position; 1 is the head; 0: it had none, an unfair wait; undefined when
   * no answer said). The message says the same numbers.
   */
  waitedMs: number | undefined;
  position: number | undefined;
  /** Whether the same request may be tried again. */
  get retryable(): boolean {
    return false;
  }

  /** The error code of the class: each subclass has its own. */
  static readonly code: string | undefined = undefined;

  constructor(message: string, status = 0, code?: string, retryAfterMs?: number, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.status = status;
    this.code = code ?? (new.target as typeof FencedError).code;
    this.retryAfterMs = retryAfterMs;
  }
}

/** 400 invalid_argument: a bad lock name, body, ttl_ms, wait_ms or lease id. */
export class InvalidArgumentError extends FencedError {
  static override readonly code = "invalid_argument";
}
/** 401 unauthenticated: a missing or wrong bearer token. */
export class UnauthenticatedError extends FencedError {
  static override readonly code = "unauthenticated";
}
/** 403 forbidden: the bearer token is known but may not do this, or not to this lock; the message says what it may do. */
export class ForbiddenError extends FencedError {
  static override readonly code = "forbidden";
}
/** 404 not_found: no such path (a wrong base URL, or an older fenced). */
export class NotFoundError extends FencedError {
  static override readonly code = "not_found";
}
/** 405 method_not_allowed. */
export class MethodNotAllowedError extends FencedError {
  static override readonly code = "method_not_allowed";
}
/** 409 held: another holder has the lease (still, after waitMs). */
export class HeldError extends FencedError {
  static override readonly code = "held";
}
/**
 * 409 held, from forceRelease(name, { token }): the lock is held by a grant
 * whose token is not the one given, and nothing was released. token is the
 * token of the grant that holds it (0n while a Redis acquisition has not
 * recorded its token yet).
 */
export class HeldByOtherError extends HeldError {
  /** The token of the grant that holds the lock instead. */
  token = 0n;
}
/**
 * Not acquired, though nobody holds the lock: the grant came back with no
 * validity left (its TTL ran out, less the drift kept, before it was
 * granted), so it was released; a longer ttlMs is what helps. fenced
 * answers it 503 unavailable with field "ttl_ms" (code "unavailable",
 * status 503; docs/design.md, defect 182), and its message, kept as it is,
 * says how long the grant took; the client rejects with it too, status 0,
 * for a grant whose answer came after its TTL ran out here (defect 117). A
 * HeldError, as the Go client's lock.ErrTTLTooShort matches
 * lock.ErrNotAcquired: tryAcquire resolves null, and a wait goes on while
 * it has time left, after the same pause as after held (not the 503's
 * Retry-After), and rejects with it if it ends with one. field is "ttl_ms".
 */
export class TTLTooShortError extends HeldError {
  constructor(message: string, status = 0, code?: string, retryAfterMs?: number, options?: { cause?: unknown }) {
    super(message, status, code, retryAfterMs, options);
    this.field = "ttl_ms";
  }
}
/**
 * 409 out_of_order: a refresh of this lease with a higher seq was applied
 * first, and this one, arriving late, was not. The lease is still held, as
 * that later refresh left it. Not retryable as it was sent (the same seq is
 * refused again); a new refresh, with a new seq, may be sent.
 */
export class OutOfOrderError extends FencedError {
  static override readonly code = "out_of_order";
}
/**
 * 410 lost: this lease id no longer holds the lease; stop writing with its
 * token. The keep-alive also reports a validity that ran out without a
 * successful refresh as a LostError (status 0).
 */
export class LostError extends FencedError {
  static override readonly code = "lost";
  /**
   * On the 410 of a release (API field maybe_released): true when the store
   * cannot tell this "not held" from the answer to an earlier release of the
   * same lease whose answer was lost; false when it is sure the lease was
   * gone before this release (expired, force-released, lost to a Redis
   * restart); undefined when the answer did not say (a server before it,
   * another request, the client's own).
   */
  maybeReleased: boolean | undefined;
}
/** 413 payload_too_large. */
export class PayloadTooLargeError extends FencedError {
  static override readonly code = "payload_too_large";
}
/** 415 unsupported_media_type. */
export class UnsupportedMediaTypeError extends FencedError {
  static override readonly code = "unsupported_media_type";
}
/** 503 unavailable: Redis or etcd failed or did not answer, or fenced is shutting down. Retryable. */
export class UnavailableError extends FencedError {
  static override readonly code = "unavailable";
  override get retryable(): boolean {
    return true;
  }
}
/** No answer: connection refused or reset, or a timeout. Retryable; whether the request took effect is unknown. */
export class TransportError extends FencedError {
  override get retryable(): boolean {
    return true;
  }
}

/**
 * The TLS handshake failed on the server's certificate: signed by a CA the
 * client does not trust (a private CA not in NODE_EXTRA_CA_CERTS nor in the
 * dispatcher given), or not issued for the host name in the base URL.
 * Nothing was sent by the attempt that rejected with it (a refresh or
 * release sent again after its answer was lost may have been applied by the
 * attempt before). Not retryable, and not a TransportError: sent again it
 * fails the same way, and a waiting acquire rejects with it at once rather
 * than ride it out as a fenced restarting until its wait is over. The
 * message says what to do; cause is fetch's error. A keep-alive whose
 * refresh fails so gives the lease up at once (its LostError's cause is
 * this error): no refresh will get through.
 */
export class CertificateError extends FencedError {}

/**
 * The server refused the TLS handshake over the client's own certificate
 * (mutual TLS, fenced serve --tls-client-ca): the client presented none (a
 * dispatcher without connect cert and key), or one the server does not
 * trust (signed by another CA, expired, not for client authentication).
 * The server says so with a TLS alert (certificate required, unknown CA,
 * bad certificate, certificate expired, …; a TLS 1.2 server that got none
 * answers a handshake failure, which counts too), under TLS 1.3 after the
 * client's side of the handshake is over, when the request was already
 * written: the server did not read it, so nothing was applied. Handled as
 * CertificateError is (not retryable, not a TransportError, not sent again
 * nor waited out, a keep-alive gives its lease up at once), but a sibling,
 * not a subclass: it is the client's certificate, not the server's, and
 * the remedy differs (cert and key in the dispatcher's connect options, not
 * a CA). The message says what to do; cause is the TLS error with the
 * alert (or fetch's error, when that names it).
 */
export class ClientCertificateError extends FencedError {}

/**
 * A redirect (3xx), which fenced never sends: something in front of it (an
 * ingress that sends http:// to https://, a moved load balancer) answered,
 * and the client follows no redirect, which for a 301 to 303 would turn a
 * DELETE or a POST into a GET (a force-release into an inspect, whose state
 * forceRelease returned as its success). Nothing was applied, and the
 * request is not sent again: point the client at the URL the message names
 * (location less the request's path). No code: not the API's error.
 */
export class RedirectError extends FencedError {
  /** The Location the redirect pointed at, resolved and with any password hidden; "" without one. */
  location = "";
}

const errorClasses: Record<string, new (m: string, s: number, c: string, r?: number) => FencedError> = {
  invalid_argument: InvalidArgumentError,
  unauthenticated: UnauthenticatedError,
  forbidden: ForbiddenError,
  not_found: NotFoundError,
  method_not_allowed: MethodNotAllowedError,
  held: HeldError,
  out_of_order: OutOfOrderError,
  lost: LostError,
  payload_too_large: PayloadTooLargeError,
  unsupported_media_type: UnsupportedMediaTypeError,
  unavailable: UnavailableError,
};

// ---------------------------------------------------------------------------
// Tokens and the Fencing-Token header

function checkToken(token: bigint | number): bigint {
  if (typeof token === "number" && !Number.isSafeInteger(token)) {
    throw new RangeError(`fencing token ${token}: not an exact integer; use a bigint`);
  }
  if (typeof token !== "bigint" && typeof token !== "number") {
    throw new TypeError(`fencing token ${String(token)}: want a bigint`);
  }
  const t = BigInt(token);
  if (t < 1n || t > MAX_TOKEN) {
    throw new RangeError(`fencing token ${t}: want 1 to ${MAX_TOKEN}`);
  }
  return t;
}

/**
 * Set the Fencing-Token header to token, in decimal, on a Headers object or
 * a plain object of headers: the contract of docs/fencing-token-http.md.
 * The header under any other spelling ("fencing-token") is replaced: a
 * request carries exactly one. A token outside 1 to 2^63−1 is a RangeError.
 */
export function setFencingToken(headers: Headers | Record<string, string>, token: bigint | number): void {
  const value = checkToken(token).toString();
  if (headers instanceof Headers) {
    headers.set(FENCING_TOKEN_HEADER, value);
    return;
  }
  // Header names are case-insensitive, but an object's keys are not: one
  // left under another spelling went out beside this one, and the resource
  // refused the two (docs/design.md, defect 176, in Go).
  for (const key of Object.keys(headers)) {
    if (key.toLowerCase() === FENCING_TOKEN_HEADER.toLowerCase()) delete headers[key];
  }
  headers[FENCING_TOKEN_HEADER] = value;
}

/** The fields of an answer that are tokens, 64-bit integers. */
const TOKEN_FIELDS = ["token", "last_token"];

/**
 * Parse an answer of the API, reading every token number ("token",
 * "last_token") as a bigint from the raw text, at any depth (a list's
 * locks have them too). A JSON string cannot contain an unescaped quote,
 * so the pattern only matches the fields themselves.
 */
export function parseAnswer(text: string): Record<string, unknown> {
  const doc: unknown = JSON.parse(text.replace(/"(token|last_token)"\s*:\s*(\d+)/g, '"$1":"$2"'));
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) {
    throw new SyntaxError("not a JSON object");
  }
  bigTokens(doc);
  return doc as Record<string, unknown>;
}

/** Turn the token fields that parseAnswer made strings back into bigints, in v and everything in it. */
function bigTokens(v: unknown): void {
  if (typeof v !== "object" || v === null) return;
  for (const [k, x] of Object.entries(v)) {
    if (TOKEN_FIELDS.includes(k) && typeof x === "string") {
      (v as Record<string, unknown>)[k] = BigInt(x);
    } else {
      bigTokens(x);
    }
  }
}

// ---------------------------------------------------------------------------
// Checks made before sending

/** The InvalidArgumentError the server would answer, thrown by the client itself (status 0): callers catch one class either way. */
function invalid(field: string, message: string): InvalidArgumentError {
  const e = new InvalidArgumentError(message, 0);
  e.field = field;
  return e;
}

/** The shortest bearer token a server takes (the Go server.MinTokenLen). */
const MIN_TOKEN_BYTES = 16;

/**
 * A TypeError unless token is one a server's token file can hold: at least
 * 16 bytes of printable ASCII without spaces, as the Go client's
 * WithBearerToken wants. Any other failed every call with a 401; one with
 * a line break, at the first call as a retryable TransportError from
 * fetch; a number was sent as its text (docs/design.md, defect 208). The
 * error never shows the token: it is a secret.
 */
function checkBearerToken(token: unknown): void {
  const want = `want a string of at least ${MIN_TOKEN_BYTES} bytes of printable ASCII without spaces, as a server's token file holds them (undefined or "": send none)`;
  if (typeof token !== "string") throw new TypeError(`bearerToken: a ${typeof token}; ${want}`);
  const bad = token.search(/[^\x21-\x7e]/);
  if (bad >= 0) {
    const cp = token.codePointAt(bad)!.toString(16).toUpperCase().padStart(4, "0");
    throw new TypeError(`bearerToken has U+${cp} at character ${bad}; ${want}`);
  }
  if (token.length < MIN_TOKEN_BYTES) throw new TypeError(`bearerToken of ${token.length} bytes; ${want}`);
}

/**
 * A character that no version of Unicode calls printable (Go's
 * unicode.IsPrint, which lock.ValidateLabel uses): a control, format
 * character, surrogate, private use, or separator but the ASCII space. One
 * Node's tables do not know (Cn) is sent for the server to decide: a test
 * for letters, marks, ... refused what a server with newer tables takes
 * (docs/design.md, defect 207).
 */
const NOT_PRINTABLE = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Zl}\p{Zp}\p{Zs}]$/u;

/**
 * value if it is a label the API takes (schema Label: 1 to 128 bytes of
 * printable UTF-8, the Go client's lock.ValidateLabel), else an
 * InvalidArgumentError naming field, before anything is sent: an owner is
 * for people, and a bad one is better refused where it is written. A
 * character Node's tables do not know is the server's to judge
 * (NOT_PRINTABLE).
 */
function checkLabel(field: string, value: unknown): string {
  const want = `want 1 to ${MAX_LABEL_BYTES} bytes of printable UTF-8`;
  if (typeof value !== "string") throw invalid(field, `${field} ${String(value)}: ${want}`);
  if (value === "") throw invalid(field, `${field}: empty; ${want}`);
  let i = 0;
  for (const ch of value) {
    // A lone surrogate (not UTF-8) is Cs: caught here too.
    if (ch !== " " && NOT_PRINTABLE.test(ch)) {
      const cp = ch.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0");
      throw invalid(field, `${field}: has U+${cp} at character ${i}; ${want}`);
    }
    i++;
  }
  const n = Buffer.byteLength(value, "utf8");
  if (n > MAX_LABEL_BYTES) throw invalid(field, `${field}: ${n} bytes; ${want}`);
  return value;
}

/**
 * waitMs if it is a wait the client can ask for (a whole number of
 * milliseconds, 0 or more; a wait longer than the server's --max-wait goes
 * in several requests), else an InvalidArgumentError before anything is
 * sent: 1.5 went out as it was, "5" and true were taken as numbers, and
 * NaN failed in a timer with Node's RangeError.
 */
function checkWait(waitMs: unknown): number {
  if (typeof waitMs !== "number" || !Number.isSafeInteger(waitMs) || waitMs < 0) {
    throw invalid("wait_ms", `waitMs ${typeof waitMs === "string" ? JSON.stringify(waitMs) : String(waitMs)}: want a whole number of milliseconds, 0 or more (0 makes one attempt)`);
  }
  return waitMs;
}

/**
 * ttlMs if it is a whole number, else an InvalidArgumentError before
 * anything is sent: NaN and Infinity went out as JSON null, which the
 * server refused as "got null". Its range is the server's to say.
 */
function checkTTL(ttlMs: unknown): number {
  if (typeof ttlMs !== "number" || !Number.isSafeInteger(ttlMs)) {
    throw invalid("ttl_ms", `ttlMs ${typeof ttlMs === "string" ? JSON.stringify(ttlMs) : String(ttlMs)}: want a whole number of milliseconds`);
  }
  return ttlMs;
}

/**
 * seq if it is a whole number, else an InvalidArgumentError before
 * anything is sent, as checkTTL. Its range is the server's to say.
 */
function checkSeq(seq: unknown): number {
  if (typeof seq !== "number" || !Number.isSafeInteger(seq)) {
    throw invalid("seq", `seq ${typeof seq === "string" ? JSON.stringify(seq) : String(seq)}: want a whole number from 1 to 2^53−1, higher with each refresh of the lease (nextRefreshSeq() draws one)`);
  }
  return seq;
}

// ---------------------------------------------------------------------------
// Refresh sequence numbers

/** The last number nextRefreshSeq handed out in this process. */
let lastRefreshSeq = 0;

/**
 * A refresh sequence number (API field seq) higher than every one this
 * process drew before: the microseconds since the Unix epoch, or the last
 * one plus one when the clock has not moved on (or went back). Every Lease
 * numbers its refreshes with it, one counter for all of them, as the Go
 * client's lock.NextRefreshSeq. Taken from the clock, the numbers of a
 * process that refreshes a lease after another (a restarted one, or
 * another holder of a reentrant lock) start above the other's, as long as
 * their clocks agree to better than the time between their refreshes.
 * Below 2^53 (a number holds it exactly) until the year 2255.
 */
export function nextRefreshSeq(): number {
  lastRefreshSeq = Math.max(Date.now() * 1000, lastRefreshSeq + 1);
  return lastRefreshSeq;
}

// ---------------------------------------------------------------------------
// Validity

/**
 * The milliseconds a lease granted ttlMs stays valid at time nowMs, when the
 * request that granted it was sent at startedMs (both performance.now()):
 * ttl − (now − started) − drift, with drift = ttl/100 + 2 ms. Not positive:
 * the lease may be gone.
 */
export function validityMs(ttlMs: number, startedMs: number, nowMs: number): number {
  return ttlMs - (nowMs - startedMs) - (ttlMs / 100 + 2);
}

// ---------------------------------------------------------------------------
// Client

/**
 * What GET /v1/locks/{name} says of a lock (API schema LockState). Never the
 * lease id nor the reentrant holder identity.
 */
export interface LockState {
  name: string;
  held: boolean;
  /** The holder's fencing token; 0n when the lock is not held. */
  token: bigint;
  /** How long the lease has left, in milliseconds: at least 1 while held, 0 when not. */
  ttlMs: number;
  /** The owner label given at acquisition; "" when none, or free. */
  owner: string;
  /** Releases to go: 1, or more for a reentrant holder's lock (AcquireOptions.holder); 0 when free. */
  count: number;
  /** For a free lock, the token of the lease that held it last, while the store still remembers (until that lease's TTL would have run out); 0n otherwise. */
  lastToken: bigint;
  /** How many wait in the lock's queue. */
  waiters: number;
  /** How long the waiter at the head of the queue has waited, in milliseconds; 0 when none waits. */
  oldestWaitMs: number;
}

/** The LockState of an answer's (parseAnswer's) lock state: inspect's, each of a list's, force-release's. */
function lockState(doc: Record<string, unknown>): LockState {
  const held = doc.held as boolean;
  // The API leaves out count 1, owner and last_token when there is none.
  return {
    name: doc.name as string,
    held,
    token: doc.token as bigint,
    ttlMs: doc.ttl_ms as number,
    owner: (doc.owner as string | undefined) ?? "",
    count: (doc.count as number | undefined) ?? (held ? 1 : 0),
    lastToken: (doc.last_token as bigint | undefined) ?? 0n,
    waiters: (doc.waiters as number | undefined) ?? 0,
    oldestWaitMs: (doc.oldest_wait_ms as number | undefined) ?? 0,
  };
}

/** One page of listLocks (API schema LockList). */
export interface LockPage {
  /** The held locks of this page, as inspect says them. */
  locks: LockState[];
  /** To pass as cursor for the next page; "" after the last. */
  nextCursor: string;
}

export interface ListOptions {
  /** List the locks whose names start with this. Default "": all (a bearer token limited to name prefixes must give one under them). */
  prefix?: string;
  /** At most this many locks in the page, 1 to MAX_LIST_LIMIT. Default: the server's, 100. */
  limit?: number;
  /** The nextCursor of the previous page; "" (the default) for the first. */
  cursor?: string;
  signal?: AbortSignal;
}

/** The most locks one page of listLocks holds (the API's limit maximum). */
export const MAX_LIST_LIMIT = 1000;

/** What GET /v1/elections/{name} says: who leads, and its term (0n when nobody leads). */
export interface Leader {
  name: string;
  leading: boolean;
  value: string;
  token: bigint;
}

/**
 * Options of a campaign: an acquire's but holder, which a campaign does not
 * take (a leader campaigning again would share its term), owner (value is
 * what observers see) and unfair (candidates are served in order).
 */
export interface ElectOptions extends Omit<AcquireOptions, "holder" | "owner" | "unfair"> {
  /** What leader() shows of the leader, such as its address. Default: none; "" is none too (no value sent), as in the Go client. */
  value?: string;
}

export interface LeadOptions extends ElectOptions {
  /** Called once if leadership is lost, from the keep-alive; a throw, or an async one's rejection, is reported with console.error. */
  onLost?: (lease: Lease, err: LostError) => void;
}

export interface LeaderOptions {
  /** Wait for a term other than this one (the last answer's token, or 0n). */
  afterToken?: bigint;
  /** With afterToken: how long to wait for another term; past the server's --max-wait, in several polls. Default 0. */
  waitMs?: number;
  signal?: AbortSignal;
}

export interface ClientOptions {
  /**
   * Sent as "Authorization: Bearer …" when the server requires it: at least
   * 16 bytes of printable ASCII without spaces, as a server's token file
   * holds them. Default (or ""): none.
   */
  bearerToken?: string;
  /**
   * Milliseconds a request may take as a whole (sending it and reading all
   * of its answer), on top of an acquire's waitMs. Default 10000. A
   * timeout of an acquisition may be a grant on its way: see acquire.
   */
  timeoutMs?: number;
  /**
   * How often a request is sent again after a 503 unavailable answer, and,
   * when it is safe to send again (tryAcquire and acquire with waitMs 0, a
   * refresh, a release, a force-release with a token), after a lost answer
   * or one that is not fenced's decision (a proxy's 502 page, …: defect
   * 119); after its Retry-After (at most 1 s; only a whole number of
   * seconds above 0 counts, as in the Go client) or 100 ms, 200 ms, …. Default
   * 2; 0 disables. Not a waiting acquire or campaign (waitMs > 0): it rides
   * out such failures, and refused connections and timeouts too, until its
   * wait ends (docs/design.md, defect 130).
   */
  retries?: number;
  /**
   * For an https base URL, the dispatcher fetch sends the requests through
   * (its RequestInit dispatcher): an undici Agent, `new Agent({ connect: {
   * ca: readFileSync("ca.pem") } })` from the undici package, trusts a
   * private CA (and with cert and key sends a client certificate, for
   * fenced's --tls-client-ca). Default: fetch's own, which trusts the
   * system's CAs and those in the file NODE_EXTRA_CA_CERTS names when Node
   * starts. A certificate not trusted rejects with CertificateError, at
   * once; a client certificate the server refuses (none, or one it does
   * not trust) with ClientCertificateError, at once.
   */
  dispatcher?: object;
}

export interface AcquireOptions {
  /** The lease's TTL; the server may grant more (etcd: whole seconds). Default: the server's (30 s unless configured). */
  ttlMs?: number;
  /** How long to wait for a held lock; a wait past the server's --max-wait (60 s by default) goes in several requests. Default 30000. */
  waitMs?: number;
  /**
   * Makes the acquisition reentrant for this holder identity (API field
   * holder). Default: none, not reentrant. An acquire by the holder that
   * holds the lock now, from this process or another, gets the same lease
   * id and token at once, with Lease.count one more, and the lock is freed
   * by as many releases. 1 to 128 bytes of printable UTF-8, sent as given:
   * the server refuses anything else (InvalidArgumentError, saying what it
   * takes). A credential as good as the lease id (whoever sends it gets the
   * lease id), so the API never shows it: pick an unguessable one, such as
   * randomBytes(16).toString("hex") drawn once per logical holder, and never
   * log it.
   */
  holder?: string;
  /**
   * A label for people (API field owner), such as "billing-7f9c on
   * host-a", that inspect and listLocks show while the lease holds the
   * lock; unlike holder it is no secret. Default: none. 1 to 128 bytes of
   * printable UTF-8: anything else rejects with InvalidArgumentError (field
   * "owner", status 0) without sending.
   */
  owner?: string;
  /**
   * Wait with no place in the lock's queue (API field unfair): take the
   * lock whenever it is found free, whoever has waited longer. Default
   * false: waiters are served in arrival order. Its waiter has no place in
   * the queue, but finds its grant after a lost answer, as in acquire.
   * With waitMs 0 it changes nothing and is not sent: one attempt takes a free lock
   * whoever waits (tryAcquire takes none).
   */
  unfair?: boolean;
  /** Cancels the call. A fair wait cut short gives its place in the queue up before the call rejects (docs/design.md, defect 134). */
  signal?: AbortSignal;
}

/** Lease.release's own option of releaseID: called before each request sent. */
const countSends = Symbol("countSends");

export interface ReleaseOptions {
  /**
   * This release's id across its retries (API field release_id): 32 hex
   * digits, such as randomBytes(16).toString("hex"). Default: a new one for
   * this call, which its own resends carry. A lock held more than once by
   * its holder (reentrant) loses one hold per release id, so a caller that
   * sends a release again itself (after a TransportError, say) passes the
   * same releaseID each time, or the retry takes off a second hold. The
   * server refuses a malformed one (InvalidArgumentError).
   */
  releaseID?: string;
}

export interface RefreshOptions {
  /**
   * This refresh's sequence number (API field seq): a whole number from 1
   * to 2^53−1, higher with each refresh of the lease, and the same when
   * this refresh is sent again (after a TransportError, say).
   * nextRefreshSeq() draws one. fenced applies no refresh below the
   * highest it applied for the lease and rejects it with OutOfOrderError,
   * so a refresh delayed on its way cannot shorten a lease that a later
   * one extended. Default: none, unordered.
   */
  seq?: number;
}

export interface LockOptions extends AcquireOptions {
  /** Called once if the lease is lost, from the keep-alive; a throw, or an async one's rejection, is reported with console.error. */
  onLost?: (lease: Lease, err: LostError) => void;
}

/** Options of Client.forceRelease. */
export interface ForceReleaseOptions {
  /**
   * Release the lock only if the grant holding it has this token (1 to
   * MAX_TOKEN; a number must be a safe integer). Default: whoever holds it.
   */
  token?: bigint | number;
}

interface CallOptions {
  timeoutMs?: number;
  retries?: number;
  signal?: AbortSignal;
  /**
   * Also retry a request whose answer was lost once it was sent, or was not
   * fenced's decision (notFencedDecision: a proxy's page, a 500, a body
   * that is not JSON; defect 119): only for a request the server answers
   * the same when asked again (a body with a waiter, a refresh, a release,
   * a force-release with a token). With a waiter (an acquisition), also
   * after the client's own timeout: its answer may be a grant on the way
   * (mayBeGranted; defect 239).
   */
  resendLost?: boolean;
  /** Called just before each request is sent. */
  onSend?: () => void;
  /**
   * For a request that waits (a long poll: wait_ms in its query): the
   * performance.now() its wait ends at. A request sent again asks for the
   * wait_ms left, not the whole again, and none is sent after it. A
   * waiting acquire or campaign has none: #take sends each of its
   * requests once, and rides out their failures itself.
   */
  waitEnd?: number;
}

/**
 * A client of one fenced server. It holds no connection of its own and may
 * be shared. Its base URL is like "http://127.0.0.1:7070" or
 * "https://fenced.example/prefix"; one with a user (or user:password), a
 * query or a fragment is refused with a TypeError, as the Go client refuses
 * it (the error shows a password as "xxxxx").
 */
export class Client {
  readonly baseURL: string;
  readonly timeoutMs: number;
  readonly retries: number;
  /** The least --max-wait a server said (max_wait_ms): a longer wait goes in requests of this length. */
  #maxWaitMs: number | undefined;
  readonly #bearer: string | undefined;
  readonly #dispatcher: object | undefined;

  constructor(baseURL: string, options: ClientOptions = {}) {
    // The URL in errors, without its password (as Go's url.URL.Redacted).
    const shown = JSON.stringify(typeof baseURL === "string" ? redactedURL(baseURL) : baseURL);
    let u: URL;
    try {
      u = new URL(baseURL);
    } catch {
      const port = /^[a-z]+:\/\/[^/?#]*:(\d+)(?:[/?#]|$)/i.exec(baseURL)?.[1];
      if (port !== undefined && Number(port) > 65535) throw new TypeError(`baseURL ${shown}: port: want a number from 1 to 65535`);
      throw new TypeError(`baseURL ${shown}: want http(s)://host:port`);
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new TypeError(`baseURL ${shown}: want http(s)://host:port`);
    }
    if (u.username !== "" || u.password !== "" || urlAuthority(baseURL).includes("@") || u.search !== "" || u.hash !== "" || /[?#]/.test(baseURL)) {
      // As the Go client refuses them. fetch refuses a URL with
      // credentials at every request, as a TransportError (retryable: a
      // waiting acquire rode it out for its whole wait, then printed the
      // password); a query or fragment, joined to each path as text, made
      // every request go to "/" (a 404). An empty "?" or "#" too.
      throw new TypeError(`baseURL ${shown}: want no user, query or fragment`);
    }
    // URL takes port 0, which would fail at the first call.
    if (u.port === "0") throw new TypeError(`baseURL ${shown}: port: want a number from 1 to 65535`);
    const timeoutMs = options.timeoutMs ?? 10_000;
    const retries = options.retries ?? 2;
    if (typeof timeoutMs !== "number" || !(timeoutMs > 0) || !Number.isFinite(timeoutMs)) throw new RangeError(`timeoutMs ${String(timeoutMs)}: want a finite number > 0`);
    if (!(retries >= 0) || !Number.isInteger(retries)) throw new RangeError(`retries ${retries}: want a whole number >= 0`);
    const bearer: unknown = options.bearerToken;
    if (bearer !== undefined && bearer !== "") checkBearerToken(bearer); // "" sends none
    const dispatcher: unknown = options.dispatcher;
    if (dispatcher !== undefined && (typeof dispatcher !== "object" || dispatcher === null)) {
      throw new TypeError(`dispatcher ${String(dispatcher)}: want an undici Dispatcher (an Agent) or none`);
    }
    this.baseURL = baseURL.replace(/\/+$/, "");
    this.timeoutMs = timeoutMs;
    this.retries = retries;
    this.#bearer = options.bearerToken;
    this.#dispatcher = options.dispatcher;
    if (u.protocol === "https:") watchRefusals();
  }

  /**
   * One attempt to take the lock: a Lease, or null if another holder has
   * it. It takes a free lock whoever waits, so it takes no unfair. Its
   * request carries a waiter with no place in the queue: one whose answer
   * was lost, or was not fenced's (a proxy's 502 page, …: defect 119), or
   * did not come within timeoutMs (defect 239), is sent again, up to
   * `retries` times, and gets the grant the first one made (the same lease
   * id and token); after the last, one attempt under the waiter releases
   * it (see acquire). A grant answered after
   * its validity ran out is released and counts as none: null; so does
   * fenced's 503 on ttl_ms, its word for the same (TTLTooShortError), which
   * is not asked again.
   */
  async tryAcquire(name: string, options: Omit<AcquireOptions, "waitMs" | "unfair"> = {}): Promise<Lease | null> {
    try {
      return await this.acquire(name, { ...options, waitMs: 0 });
    } catch (e) {
      if (e instanceof HeldError) return null;
      throw e;
    }
  }

  /**
   * Take the lock, waiting up to waitMs (default 30 s) for the holder to
   * release it or for its lease to expire. Rejects with HeldError if it is
   * still held then: when waitMs is over, not before. A 409 that comes with
   * time left (something in front of fenced answering for it, a fenced
   * restarting) is asked again after a pause (50 ms doubling to 1 s, never
   * past the wait's end), with the same waiter, for what is left, as the
   * Go client does (docs/design.md, defect 242); the HeldError's waitedMs
   * is the whole call's wait. A grant answered after its validity ran out
   * (a slow proxy, a blocked event loop) is released at once and is no grant: the
   * call goes on waiting while waitMs has time left, else rejects with
   * TTLTooShortError (a HeldError) saying so (docs/design.md, defect 117).
   * So does fenced's 503 unavailable on ttl_ms, its word for a grant that
   * came back with no validity left (defect 182): TTLTooShortError with
   * the server's message, which says how long the grant took; a wait asks
   * again after it as after a 409, not after its Retry-After.
   *
   * The request carries a waiter (32 lowercase hex digits, new for each call; a place
   * in the queue when the call waits and is fair). A request that fails
   * without fenced's decision (no answer: the connection refused, closed or
   * reset, or a timeout, TransportError; a 503; an answer not fenced's, a
   * proxy's 502 or 504 page, a 500, a body that is not JSON, behind which
   * fenced may have granted it: docs/design.md, defect 119) is sent again
   * with the same waiter while waitMs has time left, however often, after a
   * pause of 50 ms doubling to 1 s (or its Retry-After if longer, at most
   * 1 s) that never goes past the wait's end, as the Go client's (defect 130); each
   * such request waits what is left. Once no time is left for the pause,
   * the call rejects with that error, but after a lost answer or a page,
   * which may have been a grant, it asks once more at once, for what is
   * left or 1 ms: the server answers it with the grant it made for the lost
   * one, the same lease id and token. A refusal by fenced (a 4xx with its
   * error code) rejects at once. With waitMs 0 (tryAcquire) a lost answer,
   * a page, a 503 or the client's own timeout (timeoutMs) is sent again, up
   * to `retries` times. A call whose last request got no answer of
   * fenced's (lost, a page, a timeout: mayBeGranted), once retries or the
   * wait are used up, sends one attempt under its waiter in the
   * background, bounded to about 1 s, and releases the grant it gets,
   * where that grant held the lock, known to nobody, for its TTL
   * (docs/design.md, defect 239). A fair wait that
   * options.signal aborts sends, before it rejects with the abort's error,
   * one more request with its waiter, final and of 1 ms, within about 1 s
   * of its own, and releases a grant it gets: else its place would stand
   * 3 s before every later waiter (docs/design.md, defect 134).
   *
   * With options.holder the acquisition is reentrant: see
   * AcquireOptions.holder and Lease.count. options.owner labels the lease
   * for people, and options.unfair waits with no place in the queue: see
   * AcquireOptions.
   */
  async acquire(name: string, options: AcquireOptions = {}): Promise<Lease> {
    const waitMs = checkWait(options.waitMs ?? 30_000);
    const body: Record<string, unknown> = {};
    if (options.ttlMs !== undefined) body.ttl_ms = checkTTL(options.ttlMs);
    if (waitMs) body.wait_ms = waitMs;
    if (options.holder !== undefined) body.holder = options.holder;
    if (options.owner !== undefined) body.owner = checkLabel("owner", options.owner);
    if (options.unfair && waitMs > 0) body.unfair = true; // the server refuses unfair with one attempt
    return this.#take(name, "/acquire", body, waitMs, options.signal, "locks");
  }

  /** acquire, then keepAlive. Release the lease when done (withLock does). */
  async lock(name: string, options: LockOptions = {}): Promise<Lease> {
    const lease = await this.acquire(name, options);
    lease.keepAlive({ onLost: options.onLost });
    return lease;
  }

  /**
   * Run fn while holding the lock, kept alive; release when fn settles.
   * lease.signal aborts if the lease is lost meanwhile: pass it on. A
   * release that finds the lease lost rejects with LostError unless fn
   * rejected first.
   */
  async withLock<T>(name: string, options: LockOptions, fn: (lease: Lease) => Promise<T>): Promise<T> {
    const lease = await this.lock(name, options);
    let result: T;
    try {
      result = await fn(lease);
    } catch (e) {
      await lease.release().catch(() => {}); // fn's error says more
      throw e;
    }
    await lease.release();
    return result;
  }

  /**
   * Campaign in the election name, waiting up to waitMs (default 30 s) to
   * lead; rejects with HeldError if another still leads then
   * (TTLTooShortError, a HeldError, if the term came back with no validity
   * left: see acquire). The Lease is the leadership: its token is the
   * term, to send with every write; release() resigns. The server must
   * keep its leases in etcd (on Redis leases: InvalidArgumentError). A
   * waiter, a lost answer, a grant with no validity left and an abort are
   * handled as in acquire. A value of "" is none, as in the Go client
   * (docs/design.md, defect 135).
   */
  async elect(name: string, options: ElectOptions = {}): Promise<Lease> {
    const waitMs = checkWait(options.waitMs ?? 30_000);
    const body: Record<string, unknown> = {};
    if (options.ttlMs !== undefined) body.ttl_ms = checkTTL(options.ttlMs);
    if (waitMs) body.wait_ms = waitMs;
    // "" is no value, as in the Go client's Elect: the field is left out,
    // where the server refuses an empty one (docs/design.md, defect 135).
    if (options.value !== undefined && options.value !== "") body.value = options.value;
    return this.#take(name, "/campaign", body, waitMs, options.signal, "elections");
  }

  /**
   * POST an acquire or campaign body and make its answer a Lease. A wait
   * longer than the server's --max-wait (which it says in a 400 on wait_ms,
   * max_wait_ms) is asked for in requests of that length, in one place in
   * the queue; the client remembers the maximum. Only the request whose
   * wait is all the call has left is final (gives its place up if it ends
   * held); a 409 that comes before waitMs is over, a final request's too,
   * is asked again after a back-off (defect 242); if a fair wait ends
   * after a 409 to an earlier one (answered late, or the back-off ran to
   * the end), one more request, final with
   * wait_ms 1, gives the place up, and its grant is returned or its
   * HeldError thrown (docs/design.md, defect 128). A failure without
   * fenced's decision is ridden out until the wait ends (see acquire;
   * defect 130). A fair wait its signal cuts short gives its place up
   * (#giveUp), in the background, as it rejects with the abort's error
   * (defect 134).
   */
  async #take(
    name: string,
    action: "/acquire" | "/campaign",
    body: Record<string, unknown>,
    waitMs: number,
    signal: AbortSignal | undefined,
    kind: "locks" | "elections",
  ): Promise<Lease> {
    // The key to this call's grant if an answer is lost, and one place in
    // the queue for every request of a fair wait (API field waiter). One
    // attempt and an unfair wait have no place, but find their grant all
    // the same.
    body.waiter = randomBytes(16).toString("hex");
    let started = performance.now();
    // The validity runs from the request that answered: a grant found
    // again is extended to ttl_ms by that request.
    const onSend = () => (started = performance.now());
    if (waitMs <= 0) {
      let doc: Record<string, unknown>;
      try {
        doc = await this.call("POST", name, action, body, { timeoutMs: this.timeoutMs, signal, onSend, resendLost: true }, kind);
      } catch (e) {
        // Aborted with the request in flight: the server may have granted
        // it, the answer on its way. One more attempt with the waiter finds
        // that grant and releases it (as an aborted wait's give-up does),
        // where it held the lock, known to nobody, for its TTL
        // (docs/design.md, "A lost answer"). So may the last request
        // sent, once `retries` are used up, if it got no answer of
        // fenced's: lost, a proxy's page, or the client's own timeout
        // (mayBeGranted; defect 239).
        if ((signal?.aborted && !(e instanceof FencedError && !undecided(e))) || mayBeGranted(e)) void this.#giveUp(name, action, body, kind, false);
        throw e;
      }
      const lease = await this.#adopt(doc, started, name, action);
      if (lease) return lease;
      throw noValidity(name, action);
    }
    const fair = body.unfair !== true;
    const began = performance.now();
    const end = began + waitMs;
    let position = 0; // in the queue, as the last 409 that had one said
    let backoffMs = MIN_HELD_BACKOFF_MS;
    // The pause after a request that got no decision: 50 ms doubling to
    // 1 s, as the Go client's (docs/design.md, defect 130).
    let awayMs = MIN_HELD_BACKOFF_MS;
    let askedPastWait = false;
    // A fair waiting request was sent (a place in the queue). The server
    // keeps the place when such a request ends, final or not, if it had not
    // yet found the lock held; a wait its caller cuts short (the signal
    // aborts) sends no next request, and the place would stand 3 s before
    // everyone behind it: a free lock answered held, an election with no
    // leader. So the call gives it up (#giveUp; docs/design.md, defect
    // 134), in the background: the caller that aborted does not wait for
    // a server that may not answer (the Go client does the same).
    let queued = false;
    try {
      for (;;) {
        const leftMs = Math.max(1, Math.ceil(end - performance.now()));
        const askMs = Math.min(leftMs, this.#maxWaitMs ?? leftMs);
        body.wait_ms = askMs;
        // The request whose wait is all the call has left gives its place up
        // if it ends held, rather than keep a free lock from those behind
        // it; an earlier one keeps it for the next.
        const last = askMs >= leftMs;
        if (fair) body.final = last;
        queued ||= fair;
        try {
          // Sent once (retries 0): a failure without fenced's decision is
          // ridden out below, for the whole wait, not `retries` times.
          const doc = await this.call("POST", name, action, body, { timeoutMs: this.timeoutMs + askMs, signal, retries: 0, onSend }, kind);
          const lease = await this.#adopt(doc, started, name, action);
          if (lease) return lease;
          if (performance.now() >= end) throw noValidity(name, action);
          continue; // released: the next request, in what is left of the wait
        } catch (e) {
          if (notAGrant.has(e as object)) throw e; // fenced answered, with no grant: the call ends (not ridden out)
          if (e instanceof InvalidArgumentError && e.field === "wait_ms" && e.maxWaitMs && e.maxWaitMs < askMs) {
            this.#maxWaitMs = Math.min(e.maxWaitMs, this.#maxWaitMs ?? e.maxWaitMs);
            continue; // at once, in requests the server allows
          }
          if (undecided(e)) {
            // No decision of fenced's (no answer: refused, reset, lost or
            // timed out; a 503; another 5xx or a page without an API error
            // code): a fenced restarting, a proxy between two nodes. The
            // wait rides it out until it ends, as the Go client's does,
            // with the same waiter, so that a grant whose answer was lost
            // comes back with the next request (docs/design.md, defect
            // 130); before, `retries` failures ended a wait with most of it
            // left.
            // A Retry-After is waited (at most 1 s, as in send), but never
            // less than the back-off: "0" must not poll for the whole wait.
            const pause = Math.min(Math.max(e.retryAfterMs ?? 0, awayMs), MAX_HELD_BACKOFF_MS);
            awayMs = Math.min(2 * awayMs, MAX_HELD_BACKOFF_MS);
            if (performance.now() + pause >= end) {
              // No time is left for the pause. No request once the wait is
              // over; but a lost answer (or a page: defect 119) may be a
              // grant made for this waiter, and so may a timeout (defect
              // 239), which only another request with
              // it finds: ask once more, now, for what is left or 1 ms
              // (still a waiting request), rather than leave that lease
              // holding the lock until its TTL. Any other failure ends the
              // call here, as it would after the pause.
              if (!mayBeGranted(e) || askedPastWait) throw e;
              askedPastWait = true;
              continue;
            }
            await sleep(pause, undefined, { signal });
            continue;
          }
          awayMs = MIN_HELD_BACKOFF_MS; // fenced answered
          if (!(e instanceof HeldError)) throw e;
          if (e.position) position = e.position;
          // The wait ends when waitMs is over, not at the last request's
          // 409: one answered with time left (a proxy that answers for
          // fenced, a fenced restarting, a server whose wait is shorter
          // than asked) is asked again below, with the same waiter, for
          // what is left, as the Go client does (docs/design.md, defect
          // 241); so is a grant that came back with no validity left (503
          // on ttl_ms: nobody holds the lock), whose later grant may be
          // quicker (defect 182).
          if ((last || !fair) && performance.now() >= end) throw waitOver(e, name, kind, waitMs, began, position); // no request once the wait is over
          // A fair wait may end after a request that was not final: its 409
          // came late (a slow network, a loaded machine), or the back-off
          // below ran to the end. That request's place is kept 3 s for a next
          // one, holding a free lock from every later waiter; so the wait
          // ends with one more request, final and of 1 ms (leftMs once the
          // wait is over), which gives the place up (docs/design.md, defect
          // 128). An unfair wait has no place.
          const now = performance.now();
          if (now >= end) continue;
          let pauseMs: number;
          if (now - started >= askMs / 2) {
            // Held at the end of the wait asked for: the next request at
            // once, but no sooner than 50 ms after this one began. Requests
            // of a millisecond (a server's --max-wait 1ms) made a waiter
            // send hundreds a second (docs/design.md, defect 143).
            backoffMs = MIN_HELD_BACKOFF_MS;
            pauseMs = MIN_HELD_BACKOFF_MS - (now - started);
            if (pauseMs <= 0) continue;
          } else {
            // Held well before the wait asked for (a server's shorter limit,
            // a proxy's timeout): back off rather than poll it in a busy
            // loop, as the Go client does.
            pauseMs = backoffMs;
            backoffMs = Math.min(2 * backoffMs, MAX_HELD_BACKOFF_MS);
          }
          await sleep(Math.min(pauseMs, end - now), undefined, { signal });
          // It ended in the back-off (a final request's place is gone already).
          if ((last || !fair) && performance.now() >= end) throw waitOver(e, name, kind, waitMs, began, position);
          // A fair one's wait may be over: then the request giving its place up.
        }
      }
    } catch (e) {
      // Not after fenced's refusal (a 409 of a final request gave its place
      // up; a 4xx has none), nor the client's own (status 0). An unfair
      // wait has no place, but its request cut short may have been
      // granted: its give-up is one attempt, which finds that grant. So
      // may the last request of a wait that ends with no answer of
      // fenced's to it (mayBeGranted; defect 239).
      const cut = signal?.aborted && !(e instanceof FencedError && !undecided(e));
      if (cut || (mayBeGranted(e) && !notAGrant.has(e as object))) void this.#giveUp(name, action, body, kind, queued); // it catches every error
      throw e; // the call's own error, whatever became of the give-up
    }
  }

  /**
   * End a call its caller cut short (the signal aborted; docs/design.md,
   * defect 134): one more request with the call's waiter and body (ttl,
   * owner, holder, value), bounded to a second of its own, not by the
   * aborted signal. For a fair wait that took a place (placed), final and
   * of 1 ms: the server then lets the place go as soon as the request cut
   * short ends there too. For one attempt or an unfair wait, which have no
   * place, one attempt (no wait_ms, unfair nor final). Its answer may be a
   * grant: the lock came free, or the request cut short was granted and
   * its waiter finds that grant again (which would otherwise hold the
   * lock, known to nobody, until its TTL); neither is the caller's, so it
   * is released at once. Best effort: every error is ignored.
   */
  async #giveUp(name: string, action: "/acquire" | "/campaign", body: Record<string, unknown>, kind: "locks" | "elections", placed: boolean): Promise<void> {
    const bound = AbortSignal.timeout(1000);
    const { wait_ms: _w, unfair: _u, final: _f, ...attempt } = body;
    try {
      const again = placed ? { ...body, wait_ms: 1, final: true } : attempt;
      const doc = await this.call("POST", name, action, again, { timeoutMs: 1000, signal: bound, resendLost: true }, kind);
      if (typeof doc.lease_id !== "string") return;
      const release = { lease_id: doc.lease_id, release_id: randomBytes(16).toString("hex") };
      await this.call("POST", name, "/release", release, { timeoutMs: 1000, signal: bound, resendLost: true });
    } catch {
      // Best effort: the caller gets its own error; a place left goes in 3 s, a grant with its TTL.
    }
  }

  /**
   * The Lease of a grant, or undefined if its answer came after its
   * validity ran out (a slow proxy, a pause, a blocked event loop): such a
   * lease may be gone at the server already, and a caller handed it could
   * act on a lock another holds. It is released at once (the Go client's
   * adopt does the same), best effort and within about a second, its
   * errors ignored: the lease expires anyway, releasing only frees it
   * sooner (docs/design.md, defect 117).
   */
  async #adopt(doc: Record<string, unknown>, started: number, name: string, action: "/acquire" | "/campaign"): Promise<Lease | undefined> {
    // The one place an answer becomes a Lease: one that lacks a field of
    // a grant is an error that says so, as the Go client's adopt.
    const ttlMs = doc.ttl_ms;
    if (!(typeof doc.lease_id === "string" && doc.lease_id !== "" && typeof doc.token === "bigint" && doc.token > 0n && typeof ttlMs === "number" && Number.isSafeInteger(ttlMs) && ttlMs > 0)) {
      const verb = action === "/acquire" ? "acquire" : "campaign";
      const err = new FencedError(`${verb} ${JSON.stringify(name)}: the server's answer lacks lease_id, token or ttl_ms`, 200);
      notAGrant.add(err);
      throw err;
    }
    if (typeof doc.name !== "string") doc = { ...doc, name }; // the lock asked for: the answer's is that one
    const lease = new Lease(this, doc, started);
    if (performance.now() < lease.deadline) return lease;
    const body = { lease_id: lease.leaseID, release_id: randomBytes(16).toString("hex") };
    await this.call("POST", lease.name, "/release", body, { timeoutMs: 1000, retries: 0 }).catch(() => {});
    return undefined;
  }

  /** elect, then keepAlive: lease.signal aborts if leadership is lost. Release (resign) when done. */
  async lead(name: string, options: LeadOptions = {}): Promise<Lease> {
    const lease = await this.elect(name, options);
    lease.keepAlive({ onLost: options.onLost });
    return lease;
  }

  /**
   * Who leads the election name. With afterToken and waitMs, waits up to
   * waitMs for a term other than afterToken: a long poll, to follow every
   * change. A wait longer than the server's --max-wait (60 s by default),
   * which it refuses with a 400 saying its maximum (max_wait_ms, remembered
   * as acquire does), goes in polls of that length, one after another, as
   * the Go client's Observe does (docs/design.md, defect 135): the call
   * resolves with the first answer of another term, or with the last
   * answer once waitMs is over. A poll retried after a 503 waits only what
   * is left of its wait.
   */
  async leader(name: string, options: LeaderOptions = {}): Promise<Leader> {
    const waitMs = checkWait(options.waitMs ?? 0);
    const after = options.afterToken;
    if (waitMs && after === undefined) {
      throw invalid("wait_ms", `waitMs ${waitMs}: a long poll needs afterToken, the term to wait past (0n: wait until someone leads)`);
    }
    const end = performance.now() + waitMs;
    for (;;) {
      let query = "";
      let askMs = 0;
      let waitEnd: number | undefined;
      if (after !== undefined) {
        const q = new URLSearchParams({ after_token: after.toString() });
        if (waitMs) {
          const leftMs = Math.max(1, Math.ceil(end - performance.now()));
          askMs = Math.min(leftMs, this.#maxWaitMs ?? leftMs);
          q.set("wait_ms", String(askMs));
          waitEnd = performance.now() + askMs;
        }
        query = "?" + q.toString();
      }
      let doc: Record<string, unknown>;
      try {
        doc = await this.call("GET", name, query, undefined, { timeoutMs: this.timeoutMs + askMs, signal: options.signal, waitEnd }, "elections");
      } catch (e) {
        if (e instanceof InvalidArgumentError && e.field === "wait_ms" && e.maxWaitMs && e.maxWaitMs < askMs) {
          this.#maxWaitMs = Math.min(e.maxWaitMs, this.#maxWaitMs ?? e.maxWaitMs);
          continue; // at once, in polls the server allows
        }
        throw e;
      }
      const leader = { name: doc.name as string, leading: doc.leading as boolean, value: (doc.value as string | undefined) ?? "", token: doc.token as bigint };
      // The same term after a poll shorter than the wait: the next poll, for what is left.
      if (leader.token === after && askMs && performance.now() < end) continue;
      return leader;
    }
  }

  /**
   * The lock's state: whether it is held, its token, TTL left, owner label,
   * count, last token, and its queue (see LockState); never the lease id
   * nor the holder identity.
   */
  async inspect(name: string): Promise<LockState> {
    return lockState(await this.call("GET", name, "", undefined));
  }

  /**
   * One page of the locks held now whose names start with options.prefix,
   * in no promised order: at most options.limit of them (1 to
   * MAX_LIST_LIMIT; default the server's, 100), from options.cursor (""
   * for the first page, then the previous page's nextCursor). A lock held
   * while all the pages are read is listed; one acquired or released
   * meanwhile may be missed or listed twice. A limit out of range rejects
   * with InvalidArgumentError (field "limit") without sending, as the Go
   * client's List does; a bad prefix or cursor reaches the server, which
   * says what it takes. A bearer token limited to name prefixes lists under
   * one of them only (ForbiddenError, field "prefix"). iterLocks follows
   * the cursors.
   */
  async listLocks(options: ListOptions = {}): Promise<LockPage> {
    const q = new URLSearchParams();
    if (options.prefix) q.set("prefix", options.prefix);
    if (options.limit !== undefined) {
      const limit = options.limit;
      if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIST_LIMIT) {
        throw invalid("limit", `limit ${String(limit)}: want a whole number from 1 to ${MAX_LIST_LIMIT} (or none: the server's default)`);
      }
      q.set("limit", String(limit));
    }
    if (options.cursor) q.set("cursor", options.cursor);
    const query = q.size ? "?" + q.toString() : "";
    const doc = await this.send("GET", `${this.baseURL}/v1/locks${query}`, undefined, { signal: options.signal });
    return {
      locks: (doc.locks as Record<string, unknown>[]).map(lockState),
      nextCursor: (doc.next_cursor as string | undefined) ?? "",
    };
  }

  /**
   * Every lock held whose name starts with prefix, as listLocks reads
   * them, page after page (of options.limit each; default the server's),
   * following nextCursor until the last page. A page is asked for only
   * once the one before has been used up.
   */
  async *iterLocks(prefix = "", options: Omit<ListOptions, "prefix" | "cursor"> = {}): AsyncGenerator<LockState, void, undefined> {
    let cursor = "";
    for (;;) {
      const page = await this.listLocks({ ...options, prefix, cursor });
      yield* page.locks;
      if (!page.nextCursor) return;
      cursor = page.nextCursor;
    }
  }

  /**
   * Delete the lock's lease whoever holds it, and wake the next waiter: an
   * operator's act, for a holder known to be gone (DELETE
   * /v1/locks/{name}; the bearer token needs the force-release permission,
   * else ForbiddenError). Resolves to the state the lock had: its token,
   * owner, …; held false if nobody held it, as the Go client's
   * ForceRelease. The holder learns of it at its next refresh or release
   * (LostError); its token still fences its late writes.
   *
   * With options.token (1 to MAX_TOKEN), only the grant with that token is
   * released: a lock held by another rejects with HeldByOtherError (its
   * token says whose), and nothing is released. Such a call is sent again
   * after a 503, a lost answer or an answer not fenced's (a proxy's 502
   * page, …: defect 119), as a release is: the next holder has
   * another token, so a request sent again releases nobody else. It then
   * resolves to held false or rejects with HeldByOtherError, as it would
   * if the grant had gone before the first request; either way that token
   * no longer holds the lock, which is what was asked.
   *
   * Without a token the request is sent once: after a 503, an answer
   * lost once it was sent or one not fenced's (a proxy's 502 page), the
   * error says the lock may have been released, since a second request
   * would release whatever holds it by then, most often the waiter the
   * first one woke. Inspect the lock then: if it is still held, by the
   * holder meant, force-release it with the token it shows (a free lock
   * shows token 0n, which names no grant: InvalidArgumentError).
   */
  async forceRelease(name: string, options: ForceReleaseOptions = {}): Promise<LockState> {
    let token: bigint | undefined;
    if (options.token !== undefined) {
      try {
        token = checkToken(options.token);
      } catch (e) {
        throw invalid("token", `token: ${(e as Error).message}, the token of the grant to release (none: release it whoever holds it)`);
      }
    }
    try {
      if (token === undefined) return lockState(await this.call("DELETE", name, "", undefined, { retries: 0 }));
      return lockState(await this.call("DELETE", name, `?token=${token}`, undefined, { resendLost: true }));
    } catch (e) {
      // Not held: nothing to release (a 404 on the lock, no field).
      if (e instanceof NotFoundError && e.field === undefined) {
        return { name, held: false, token: 0n, ttlMs: 0, owner: "", count: 0, lastToken: 0n, waiters: 0, oldestWaitMs: 0 };
      }
      if (token === undefined && (e instanceof UnavailableError || (e instanceof TransportError && !refused(e)) || notFencedDecision(e))) {
        const cls = e.constructor as new (m: string, s: number, c?: string, r?: number, o?: { cause?: unknown }) => FencedError;
        throw new cls(
          `${e.message}; the request may have reached the server and released the lock, so it is not sent again ` +
            "(a second would release the next holder): inspect the lock to see whether it is held now and by whom; " +
            "if by the holder to release, force-release it with that token, which is safe to send again",
          e.status,
          e.code,
          e.retryAfterMs,
          { cause: e },
        );
      }
      throw e;
    }
  }

  /**
   * Extend the lease leaseID of name; the raw answer. Lease.refresh is the
   * usual way. A refresh whose answer was lost, or was not fenced's (a
   * proxy's 502 page, a 500, …: defect 119), is sent again, as a
   * release's is: a refresh by the same lease id extends it again, from
   * later. options.seq orders it after the lease's earlier refreshes (see
   * RefreshOptions): pass increasing numbers, such as nextRefreshSeq()'s,
   * and the same one when you send a refresh again yourself. A late one
   * rejects with OutOfOrderError and was not applied.
   */
  async refreshID(name: string, leaseID: string, ttlMs?: number, options: RefreshOptions & CallOptions = {}): Promise<Record<string, unknown>> {
    const body: Record<string, unknown> = { lease_id: leaseID };
    if (ttlMs !== undefined) body.ttl_ms = checkTTL(ttlMs);
    if (options.seq !== undefined) body.seq = checkSeq(options.seq); // in every resend of this call's request
    return this.call("POST", name, "/refresh", body, { resendLost: true, ...options });
  }

  /**
   * Release the lease leaseID of name. Lease.release is the usual way. A
   * release whose answer was lost, or was not fenced's (a proxy's 502
   * page, a 500, …: defect 119), is sent again, as a 503 is (up to
   * `retries` times): the server answers a release by the lease id that
   * released it with success, so asking again is safe. Every request of
   * the call carries the same release_id (options.releaseID, or one drawn
   * for this call), so a resend takes off no second hold of a lock held
   * more than once by its holder.
   */
  async releaseID(name: string, leaseID: string, options: ReleaseOptions & { [countSends]?: () => void } = {}): Promise<void> {
    const body = { lease_id: leaseID, release_id: options.releaseID ?? randomBytes(16).toString("hex") };
    await this.call("POST", name, "/release", body, { resendLost: true, onSend: options[countSends] });
  }

  private async call(
    method: string,
    name: string,
    action: string,
    body: Record<string, unknown> | undefined,
    options: CallOptions = {},
    kind: "locks" | "elections" = "locks",
  ): Promise<Record<string, unknown>> {
    if (typeof name !== "string" || name === "") {
      throw new TypeError(`lock name ${JSON.stringify(name)}: want a non-empty string`);
    }
    if (name === "." || name === "..") {
      // Dot segments: fetch's URL parser removes them from the path (RFC
      // 3986, 5.2.4), percent-encoded too, so the request would reach
      // another route. fenced refuses them as lock names too.
      throw new InvalidArgumentError(`lock name ${JSON.stringify(name)}: "." and ".." are not lock names (a URL path cannot carry them)`);
    }
    // Any other bad name still reaches the server, which says what is allowed.
    return this.send(method, `${this.baseURL}/v1/${kind}/${encodeURIComponent(name)}${action}`, body, options);
  }

  /** call's request to url (with its query), which names no lock (the list) or one call checked. */
  private async send(
    method: string,
    url: string,
    body: Record<string, unknown> | undefined,
    options: CallOptions = {},
  ): Promise<Record<string, unknown>> {
    const retries = options.retries ?? this.retries;
    let timeoutMs = options.timeoutMs ?? this.timeoutMs;
    for (let attempt = 0; ; attempt++) {
      try {
        options.onSend?.();
        return await this.request(method, url, body, timeoutMs, options.signal);
      } catch (e) {
        // A lost answer, or one that is not fenced's decision (a proxy's
        // 502 or 504 page, a 500, a body that is not JSON: fenced may have
        // acted behind it, docs/design.md, defect 119), is asked again only
        // with a waiter (or for a refresh, a release, a force-release with
        // a token): without one, a grant the server made would hold the
        // lock, known to nobody, and the next request would wait behind it.
        // An acquisition (a body with a waiter, which finds its grant) also
        // after a timeout: a lost answer all the same (defect 239).
        const unsure = (e instanceof TransportError && (answerLost(e) || (body?.waiter !== undefined && timedOut.has(e)))) || notFencedDecision(e);
        const again = e instanceof UnavailableError || (options.resendLost === true && unsure);
        if (!again || attempt >= retries) throw e;
        const pause = Math.min(e.retryAfterMs ?? 100 * (attempt + 1), 1000) * (0.5 + Math.random() / 2);
        if (options.waitEnd !== undefined) {
          // A long poll (leader): none is sent once its wait is over (or
          // will be after the pause). A waiting acquire or campaign rides
          // out its failures in #take, request by request.
          const leftMs = Math.floor(options.waitEnd - performance.now() - pause);
          if (leftMs < 1) throw e;
          if (body !== undefined) {
            body.wait_ms = leftMs;
          } else {
            const u = new URL(url);
            u.searchParams.set("wait_ms", String(leftMs));
            url = u.toString();
          }
          timeoutMs = this.timeoutMs + leftMs;
        }
        await sleep(pause, undefined, { signal: options.signal }); // back off before retrying
      }
    }
  }

  private async request(
    method: string,
    url: string,
    body: Record<string, unknown> | undefined,
    timeoutMs: number,
    signal: AbortSignal | undefined,
  ): Promise<Record<string, unknown>> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (this.#bearer) headers.Authorization = `Bearer ${this.#bearer}`;
    const timeout = AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs)));
    let resp: Response;
    let text: string;
    try {
      resp = await fetch(url, {
        method,
        // fenced never redirects, and a redirect followed turns a DELETE
        // (303) or a POST (301 to 303) into a GET: a force-release into an
        // inspect, whose state was returned as its success. In Node
        // (undici), "manual" gives the 3xx answer itself (redirected).
        redirect: "manual",
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
        ...(this.#dispatcher ? ({ dispatcher: this.#dispatcher } as RequestInit) : {}),
      });
      text = await resp.text();
    } catch (e) {
      if (signal?.aborted) throw signal.reason;
      // The server refused the client's certificate (mutual TLS): as a
      // certificate not trusted, no transient failure, and nothing applied.
      const refusal = timeout.aborted ? undefined : refusedClientCertificate(e);
      if (refusal) {
        const reason = refusal.code.slice("ERR_SSL_".length).toLowerCase().replaceAll("_", " ");
        throw new ClientCertificateError(
          `${method} ${url}: the server refused the client's TLS certificate (${reason}): ` +
            `${CLIENT_CERTIFICATE_ALERTS.get(refusal.code) || OTHER_CLIENT_CERTIFICATE_REFUSAL}; not retried`,
          0, undefined, undefined, { cause: refusal });
      }
      // No transient failure: every handshake fails the same way until
      // the client is told to trust the certificate.
      const bad = !timeout.aborted && untrustedCertificate(e);
      if (bad) {
        throw new CertificateError(
          `${method} ${url}: the server's TLS certificate is not trusted (${bad}): give the client the CA that signed it ` +
            `(NODE_EXTRA_CA_CERTS=ca.pem, or the dispatcher option: new Agent({ connect: { ca } }) from undici), ` +
            `and check that the certificate names the host of ${this.baseURL}; not retried`,
          0, undefined, undefined, { cause: e });
      }
      const why = timeout.aborted ? `no answer within ${timeoutMs} ms` : String((e as Error)?.cause ?? e);
      const err = new TransportError(`${method} ${url}: ${why}`, 0, undefined, undefined, { cause: e });
      if (timeout.aborted) timedOut.add(err);
      throw err;
    }
    if (resp.status >= 300 && resp.status < 400) throw redirected(method, url, this.baseURL, resp);
    if (resp.ok && resp.status !== 200) {
      // fenced's only success is 200 (the API's, and the Go client's,
      // reading): a 202 {} or a 204 is something in front of it answering
      // in its place, maybe without passing the request on. Taken as
      // fenced's answer, a release "succeeded" while fenced held the lock
      // until its TTL (docs/design.md, defect 237). No decision of
      // fenced's (notFencedDecision): sent again where that is safe, as a
      // proxy's page is.
      const said = text ? `: ${JSON.stringify(text.slice(0, 80))}` : "";
      throw new FencedError(`${method} ${url}: HTTP ${resp.status}, not fenced's answer (fenced answers 200 or an API error)${said}`, resp.status);
    }
    if (resp.ok) {
      try {
        return parseAnswer(text);
      } catch {
        throw new FencedError(`${method} ${url}: answer is not a JSON object: ${JSON.stringify(text.slice(0, 80))}`, resp.status);
      }
    }
    throw apiError(resp.status, resp.headers, text);
  }
}

/**
 * The authority of a URL as written (user info, host and port): what
 * follows "scheme:" and its slashes, up to the first "/", "\\", "?" or
 * "#", as the URL parser reads it; "" if raw has no scheme.
 */
function urlAuthority(raw: string): string {
  return /^[\x00-\x20]*[a-z][a-z0-9+.-]*:[/\\]*([^/\\?#]*)/i.exec(raw)?.[1] ?? "";
}

/**
 * raw with the password of its user info, if any, replaced by "xxxxx", as
 * Go's url.URL.Redacted shows a URL: for the constructor's errors, which
 * must not print a secret (docs/design.md, defect 162).
 */
function redactedURL(raw: string): string {
  const m = /^([\x00-\x20]*[a-z][a-z0-9+.-]*:[/\\]*)([^/\\?#]*)([\s\S]*)$/i.exec(raw);
  if (!m) return raw;
  const at = m[2].lastIndexOf("@");
  const colon = m[2].indexOf(":");
  if (at < 0 || colon < 0 || colon > at) return raw;
  return `${m[1]}${m[2].slice(0, colon)}:xxxxx${m[2].slice(at)}${m[3]}`;
}

/**
 * An acquire's or campaign's 200 answer that lacks lease_id, token or
 * ttl_ms ({} from a wrong base URL, or a proxy's): the call rejects with
 * it, as the Go client's adopt errs, rather than make a Lease with
 * undefined fields, and a waiting one does not ride it out (#take).
 */
const notAGrant = new WeakSet<object>();

/** The TTLTooShortError (a HeldError) of an acquire or campaign whose grant came with no validity left, released by Client.#adopt (docs/design.md, defect 117). */
function noValidity(name: string, action: "/acquire" | "/campaign"): TTLTooShortError {
  const verb = action === "/acquire" ? "acquire" : "campaign";
  return new TTLTooShortError(`${verb} ${JSON.stringify(name)}: the grant came with no validity left (answered after its TTL ran out); released it, not acquired`, 0);
}

/** The pauses between the requests of a wait after a 409 that came well before the wait asked for: doubled each time, as the Go client's. After one at the end of it, the next request goes no sooner than MIN_HELD_BACKOFF_MS after that one began (defect 143). */
const MIN_HELD_BACKOFF_MS = 50;
const MAX_HELD_BACKOFF_MS = 1000;

/** The keep-alive's least pause after a failed refresh is min(ttl/10, this), as the Go client's keep-alive (lock.Lease's step). */
const MAX_KEEP_ALIVE_PAUSE_MS = 1000;

/**
 * The error codes of a connection that closed or was reset after the
 * request went out, before or while its answer came: the server may have
 * acted on it. Not a refused connection (nothing was sent) and not a
 * timeout (the server may still be waiting).
 */
const LOST_ANSWER_CODES = new Set(["UND_ERR_SOCKET", "ECONNRESET", "EPIPE", "ECONNABORTED"]);

/**
 * The codes of Node's errors for a server certificate that failed
 * verification (OpenSSL's X509_V_ERR_* names, and the host name check's).
 */
const CERTIFICATE_CODES = new Set([
  "UNABLE_TO_GET_ISSUER_CERT", "UNABLE_TO_GET_ISSUER_CERT_LOCALLY", "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "DEPTH_ZERO_SELF_SIGNED_CERT", "SELF_SIGNED_CERT_IN_CHAIN", "CERT_UNTRUSTED", "CERT_REJECTED",
  "CERT_HAS_EXPIRED", "CERT_NOT_YET_VALID", "CERT_SIGNATURE_FAILURE", "UNABLE_TO_DECRYPT_CERT_SIGNATURE",
  "UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY", "CERT_CHAIN_TOO_LONG", "INVALID_CA", "PATH_LENGTH_EXCEEDED",
  "INVALID_PURPOSE", "HOSTNAME_MISMATCH", "ERR_TLS_CERT_ALTNAME_INVALID",
]);

/** Why fetch's error e is a server certificate not trusted (its cause's message), or "" if it is not one. */
function untrustedCertificate(e: unknown): string {
  let cause: unknown = e;
  for (let depth = 0; depth < 5 && typeof cause === "object" && cause !== null; depth++) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === "string" && CERTIFICATE_CODES.has(code)) return String((cause as { message?: unknown }).message ?? code);
    cause = (cause as { cause?: unknown }).cause;
  }
  return "";
}

const NO_CLIENT_CERTIFICATE =
  "give the client a certificate signed by a CA the server trusts (its --tls-client-ca), with its key: the dispatcher " +
  "option, new Agent({ connect: { ca, cert, key } }) from undici";

/**
 * Node's codes (ERR_SSL_ and OpenSSL's reason) of the TLS alerts, received
 * from the server (OpenSSL names an alert it sent otherwise), by which a
 * server refuses the client's certificate, and what to do about each. A
 * TLS 1.2 server that requires a certificate answers handshake_failure
 * when it got none (TLS 1.3 has certificate_required); that alert can also
 * mean no cipher suite or version in common, as permanent, so its advice
 * is hedged.
 */
const CLIENT_CERTIFICATE_ALERTS = new Map([
  ["ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED", `the server requires a client certificate (mutual TLS) and got none: ${NO_CLIENT_CERTIFICATE}`],
  ["ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE",
    "if the server requires a client certificate (mutual TLS), as a TLS 1.2 server says when it got none, " +
      `${NO_CLIENT_CERTIFICATE} (the alert can also mean no TLS version or cipher suite in common)`],
  ["ERR_SSL_TLSV1_ALERT_UNKNOWN_CA",
    "the server does not trust the CA that signed the client's certificate: give the client a certificate signed " +
      "by a CA the server trusts (its --tls-client-ca), with its key (the dispatcher's connect cert and key)"],
  ["ERR_SSL_SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "the client's certificate has expired or is not valid yet: give the client a certificate valid now (the " +
      "dispatcher's connect cert and key)"],
  ["ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE", ""],
  ["ERR_SSL_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", ""],
  ["ERR_SSL_SSLV3_ALERT_CERTIFICATE_REVOKED", ""],
  ["ERR_SSL_SSLV3_ALERT_CERTIFICATE_UNKNOWN", ""],
]);
const OTHER_CLIENT_CERTIFICATE_REFUSAL =
  "give the client a certificate the server accepts (the dispatcher's connect cert and key): signed by a CA the " +
  "server trusts (its --tls-client-ca), valid now, issued for client authentication (extendedKeyUsage clientAuth)";

/**
 * The alerts refusing the client's certificate that TLS connections of
 * fetch (undici) got, by the connection's addresses, until the request that
 * failed on it takes its own. Under TLS 1.3 the alert comes after the
 * client's side of the handshake, the request written; the connection
 * emits it as an error, but undici then ends the request with its own
 * error for the close that follows ("other side closed", UND_ERR_SOCKET,
 * which names the connection's addresses and not the alert), read as an
 * answer lost: the alert is told only to listeners of the connection, which
 * undici's diagnostics channel "undici:client:connected" hands over (Node's
 * fetch and the undici package alike). At most 64 kept: those of requests
 * not this client's (the channel sees every connection of the process) go.
 */
const refusals = new Map<string, Error & { code: string }>();
let watchingRefusals = false;

function watchRefusals(): void {
  if (watchingRefusals) return;
  watchingRefusals = true;
  subscribe("undici:client:connected", (message: unknown) => {
    const socket = (message as { socket?: unknown } | null)?.socket as
      | { on?: unknown; localAddress?: string; localPort?: number; remoteAddress?: string; remotePort?: number }
      | undefined;
    if (typeof socket?.on !== "function") return;
    const key = connectionKey(socket); // now: a socket's addresses are gone once it is closed
    (socket.on as (event: string, f: (e: unknown) => void) => void).call(socket, "error", (e: unknown) => {
      const code = (e as { code?: unknown } | null)?.code;
      if (typeof code !== "string" || !CLIENT_CERTIFICATE_ALERTS.has(code) || refusals.has(key)) return;
      refusals.set(key, e as Error & { code: string });
      if (refusals.size > 64) refusals.delete(refusals.keys().next().value as string);
    });
  });
}

/** The key of a connection in refusals: its addresses, as a socket and undici's socket info name them. */
function connectionKey(s: { localAddress?: string; localPort?: number; remoteAddress?: string; remotePort?: number }): string {
  return `${s.localAddress}:${s.localPort}>${s.remoteAddress}:${s.remotePort}`;
}

/**
 * The TLS error of the server's alert refusing the client's certificate
 * that fetch's error e was, or undefined: named in e's causes (a handshake
 * that failed, TLS 1.2), or got by the connection that undici's "other
 * side closed" names (TLS 1.3: see refusals).
 */
function refusedClientCertificate(e: unknown): (Error & { code: string }) | undefined {
  let cause: unknown = e;
  for (let depth = 0; depth < 5 && typeof cause === "object" && cause !== null; depth++) {
    const c = cause as { code?: unknown; socket?: unknown; cause?: unknown };
    if (typeof c.code === "string" && CLIENT_CERTIFICATE_ALERTS.has(c.code)) return cause as Error & { code: string };
    if (c.code === "UND_ERR_SOCKET" && typeof c.socket === "object" && c.socket !== null) {
      const key = connectionKey(c.socket as Parameters<typeof connectionKey>[0]);
      const alert = refusals.get(key);
      if (alert) {
        refusals.delete(key);
        return alert;
      }
    }
    cause = c.cause;
  }
  return undefined;
}

/** Whether e (a TransportError) is a refused connection: the request never reached the server. */
function refused(e: TransportError): boolean {
  let cause: unknown = e.cause;
  for (let depth = 0; depth < 5 && typeof cause === "object" && cause !== null; depth++) {
    if ((cause as { code?: unknown }).code === "ECONNREFUSED") return true;
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}

/** Whether e (a TransportError) is a request sent whose answer never came: its causes name a closed or reset connection. */
function answerLost(e: TransportError): boolean {
  let cause: unknown = e.cause;
  for (let depth = 0; depth < 5 && typeof cause === "object" && cause !== null; depth++) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === "string" && LOST_ANSWER_CODES.has(code)) return true;
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * Whether a refresh or release that failed with e may have been applied by
 * fenced all the same. Not applied: a refusal by fenced itself, an HTTP 4xx
 * answer with an API error code (HeldError, OutOfOrderError,
 * InvalidArgumentError, …; LostError is the caller's to handle), or an
 * error the client raised before sending (status 0, not a TransportError).
 * Anything else may have been: no answer, any 5xx, and an answer that is
 * not fenced's (a proxy's 502 or 504 page, a 4xx page without a code, a
 * body that is not JSON, even with 200) may come after fenced applied it,
 * as the Go client counts every failure but lost (docs/design.md, defect
 * 114).
 */
function maybeApplied(e: unknown): boolean {
  if (!(e instanceof FencedError)) return true; // the call's abort, or a fault on the way: perhaps sent
  if (e instanceof TransportError) return true;
  if (e instanceof RedirectError) return false; // reached no fenced: nothing was applied
  // A failed handshake sent nothing; a request written before the server
  // refused the client's certificate was not read: nothing was applied.
  if (e instanceof CertificateError || e instanceof ClientCertificateError) return false;
  if (e instanceof TTLTooShortError) return false; // fenced's decision, though a 503: released, not acquired
  if (e.status === 0) return false; // refused by the client itself: nothing was sent
  return !(e.status >= 400 && e.status < 500 && e.code !== undefined);
}

/**
 * Whether e is an answer that is not fenced's decision: an HTTP answer,
 * not a 503 (UnavailableError, retried as ever), that maybeApplied counts:
 * any other 5xx, or a body with no API error code (a proxy's HTML or text
 * page of any status, a body that is not JSON, a 200 that is not a JSON
 * object, any 2xx but 200: defect 237). fenced may have acted on the
 * request behind it (a proxy's 502
 * or 504 after forwarding it), so a request safe to send again is sent
 * again, as after a lost answer (docs/design.md, defect 119).
 */
function notFencedDecision(e: unknown): e is FencedError {
  return e instanceof FencedError && !(e instanceof TransportError) && !(e instanceof UnavailableError) && e.status !== 0 && maybeApplied(e);
}

/** The TransportErrors of a request that the client's own timeout ended: see mayBeGranted. */
const timedOut = new WeakSet<object>();

/**
 * Whether an acquire or campaign that failed with e may have been granted,
 * for its waiter to find: its answer lost (answerLost), not fenced's
 * decision (notFencedDecision), or ended by the client's own timeout, the
 * request maybe sent and its answer on the way (a proxy holding it, a link
 * gone slow). fetch does not say whether a timed-out request went out;
 * with a waiter, asking again is safe either way. Such a request is sent
 * again with its waiter while retries (or the wait) allow, and after the
 * last the call gives up under its waiter (#giveUp), releasing what it
 * gets (docs/design.md, defects 226 and 239).
 */
function mayBeGranted(e: unknown): e is FencedError {
  return (e instanceof TransportError && (answerLost(e) || timedOut.has(e))) || notFencedDecision(e);
}

/**
 * Whether e is a request's failure without fenced's decision, which a
 * waiting acquire or campaign rides out until its wait ends (the Go
 * client's unanswered: docs/design.md, defect 130): no answer
 * (TransportError: a refused or reset connection, a lost answer, a
 * timeout), a 503, or an answer that is not fenced's decision
 * (notFencedDecision). Not fenced's refusal (a 4xx with its error code),
 * the client's own (status 0), nor the caller's abort.
 */
function undecided(e: unknown): e is FencedError {
  return e instanceof FencedError && maybeApplied(e);
}

/**
 * The milliseconds a Retry-After header value asks for, or undefined: only
 * a whole number of seconds above 0 counts, as in the Go client's send.
 * "0" (a load balancer's 503 page whose upstreams are away for a moment),
 * a negative number, a fraction, an HTTP date or anything else is no
 * Retry-After: every caller then pauses as it would without one (the
 * waiting acquire's back-off, send's retries, the keep-alive's pause),
 * rather than go again at once, in a busy loop.
 */
function retryAfterMs(value: string | null): number | undefined {
  const t = value?.trim();
  if (t === undefined || !/^\d+$/.test(t)) return undefined;
  const secs = Math.min(Number(t), 1e9); // every caller caps it anyway
  return secs > 0 ? secs * 1000 : undefined;
}

/**
 * The RedirectError of a request to url, whose base URL is base, answered
 * with a redirect: it names where to point the client, the Location less
 * the request's path when it ends with it (as the Go client's package
 * documentation says, "Errors").
 */
function redirected(method: string, url: string, base: string, resp: Response): RedirectError {
  const raw = resp.headers.get("Location");
  const said = `${method} ${redactedURL(url)}: HTTP ${resp.status}, a redirect`;
  if (!raw) {
    return new RedirectError(`${said} without a Location, not fenced's answer: fenced never redirects, so something in front of it answered: point the client at fenced's own URL`, resp.status);
  }
  let to: string;
  try {
    to = redactedURL(new URL(raw, url).toString());
  } catch {
    to = redactedURL(raw);
  }
  const path = url.startsWith(base) ? url.slice(base.length) : "";
  const final = path !== "" && to.endsWith(path) && to.length > path.length ? to.slice(0, -path.length) : "";
  const e = new RedirectError(
    `${said} to ${to}, not fenced's answer: fenced never redirects, so something in front of it answered, and the client follows no redirect ` +
      `(a 301 to 303 would turn the request into a GET): point the client at ${final || "the URL fenced answers on"}; nothing was applied`,
    resp.status,
  );
  e.location = to;
  return e;
}

/**
 * e, the 409 held that ended a wait of waitMs for name begun at began, made
 * to say the call's wait rather than its last request's: a wait longer than
 * the server's --max-wait goes in several requests, and the last one's
 * waitedMs and message (its own few hundred ms) read as if the caller had
 * waited that long. So waitedMs is the call's, from its start here, as the
 * Go client's lock.WaitError.Waited; position the place the last request
 * that had one reported; and the message the server's words with those
 * numbers, the same whether the wait took one request or several. A
 * TTLTooShortError says why in words of its own, and is left as it is.
 */
function waitOver(e: HeldError, name: string, kind: "locks" | "elections", waitMs: number, began: number, position: number): HeldError {
  if (e.constructor !== HeldError) return e;
  const waitedMs = Math.round(performance.now() - began);
  const place = position || e.position; // 0 or undefined: none, or none said
  const [what, still] =
    kind === "elections"
      ? [`election ${JSON.stringify(name)} has another leader`, "still led"]
      : [`lock ${JSON.stringify(name)} is held by another holder`, "still held"];
  let message = `${what}; ${still} after waiting ${waitedMs} ms (wait_ms ${waitMs})`;
  if (place) message += `; this caller was number ${place} in its queue`;
  // A new error, not e with its message changed: its stack, which Node
  // prints, says the message it was made with.
  const over = new HeldError(message, e.status, e.code, e.retryAfterMs);
  over.field = e.field;
  over.waitedMs = waitedMs;
  over.position = place;
  return over;
}

function apiError(status: number, headers: Headers, text: string): FencedError {
  const retryAfter = retryAfterMs(headers.get("Retry-After"));
  let code: unknown, message: unknown, field: unknown, maxWaitMs: unknown, heldBy: unknown, maybeReleased: unknown;
  let waitedMs: unknown, position: unknown;
  try {
    // parseAnswer: the token of a force-release's 409 is a bigint.
    const err = (parseAnswer(text) as { error?: Record<string, unknown> }).error;
    code = err?.code;
    message = err?.message;
    field = err?.field;
    maxWaitMs = err?.max_wait_ms;
    heldBy = err?.token;
    maybeReleased = err?.maybe_released;
    waitedMs = err?.waited_ms;
    position = err?.position;
  } catch {
    // not JSON: below
  }
  if (typeof code !== "string" || typeof message !== "string") {
    const excerpt = JSON.stringify(text.slice(0, 200));
    if (status === 503) return new UnavailableError(`service unavailable: ${excerpt}`, status, undefined, retryAfter);
    return new FencedError(`HTTP ${status}, not an API error: ${excerpt}`, status, undefined, retryAfter);
  }
  if (code === "held" && typeof heldBy === "bigint") {
    const e = new HeldByOtherError(message, status, code, retryAfter); // a force-release with a token
    e.token = heldBy;
    return e;
  }
  // unavailable on ttl_ms: the grant came back with no validity left and
  // was released, nobody holds the lock (docs/design.md, defect 182), as
  // the Go client maps it to lock.ErrTTLTooShort.
  const cls = code === "unavailable" && field === "ttl_ms" ? TTLTooShortError : (errorClasses[code] ?? FencedError);
  const e = new cls(message, status, code, retryAfter);
  if (typeof field === "string") e.field = field;
  if (typeof maxWaitMs === "number") e.maxWaitMs = maxWaitMs;
  if (typeof waitedMs === "number") e.waitedMs = waitedMs;
  if (typeof position === "number") e.position = position;
  if (e instanceof LostError && typeof maybeReleased === "boolean") e.maybeReleased = maybeReleased;
  return e;
}

// ---------------------------------------------------------------------------
// Lease

/**
 * A held lease: name, leaseID (the holder's secret), token, ttlMs (the TTL
 * the server granted) and count (how many releases the lock took to be
 * freed when it was granted: 1, or more for a reentrant holder's acquire of
 * a lock it held; see AcquireOptions.holder), and reused (whether the grant
 * is a hold that existed before, its token issued then).
 *
 * validForMs() says how long the lease is surely still held, by the rule
 * ttl − elapsed − drift measured from before the request that granted or
 * last refreshed it was sent. keepAlive() refreshes it at ttl/3; signal
 * aborts (with a LostError as its reason) and lost resolves, once, when a
 * refresh answers lost or the validity runs out without a successful
 * refresh. release() stops the keep-alive and releases.
 *
 * Reading the state reads the clock: signal, lost, check() and
 * validForMs() find a lease whose deadline has passed lost at once (signal
 * aborted, lost resolved, onLost called, once), as the keep-alive would,
 * though its timer has not run yet (a process paused past its deadline, an
 * event loop held busy, a keep-alive off): the first read after the
 * deadline says lost (docs/design.md, defect 169). A signal or a lost
 * promise taken before cannot read the clock: call check() right before
 * each write. The token checked at the resource is what makes a late
 * write harmless.
 */
export class Lease {
  readonly name: string;
  readonly leaseID: string;
  readonly token: bigint;
  /** How many releases the lock took to be freed when this lease was granted: 1, or more when a reentrant holder acquired a lock it held. */
  readonly count: number;
  /**
   * Whether the lease is a hold that existed before this acquisition, with
   * the token issued then: a holder's reentry, or the grant made for an
   * earlier request of the same wait whose answer was lost (API field
   * reused; from a server that does not send it, count > 1, as the Go
   * client's Lease.Reused).
   */
  readonly reused: boolean;
  #ttlMs: number;
  #deadline: number;
  #refreshing: Promise<void> = Promise.resolve();
  /** The releases begun, one after another: each release() runs after the one before it settled. */
  #releasing: Promise<void> = Promise.resolve();
  /** A release was begun (or done); reset if it failed. */
  #released = false;
  /** The server released it: no longer held. */
  #releaseDone = false;
  /** A release failed in a way that may have been applied (maybeApplied: no answer, a 5xx, a proxy's page). */
  #unanswered = false;
  /**
   * Drawn by the first release(), sent by every one and by their resends: a
   * release sent again takes off no second hold of a lock its holder holds
   * more than once.
   */
  #releaseID: string | undefined;
  /** Successful refreshes so far, and when the last one was sent: the keep-alive plans from it. */
  #refreshes = 0;
  #refreshedAt: number;
  /** Wakes the keep-alive's sleep, while it sleeps. */
  #wakeKeepAlive: (() => void) | undefined;
  #client: Client;
  #lost = new AbortController();
  #lostPromise: Promise<LostError>;
  #resolveLost!: (e: LostError) => void;
  #onLost: ((lease: Lease, err: LostError) => void) | undefined;
  #stop: AbortController | undefined;
  #loop: Promise<void> | undefined;

  /** @internal Leases come from Client.acquire. */
  constructor(client: Client, doc: Record<string, unknown>, startedMs: number) {
    this.#client = client;
    this.name = doc.name as string;
    this.leaseID = doc.lease_id as string;
    this.token = doc.token as bigint;
    this.count = (doc.count as number | undefined) ?? 1; // absent for 1
    this.reused = doc.reused === undefined ? this.count > 1 : doc.reused === true;
    this.#ttlMs = doc.ttl_ms as number;
    // The grant's attempt began waited_ms after the server had the request,
    // so never before startedMs + waited_ms: the validity runs from there
    // (a wait longer than the TTL must not void the grant).
    startedMs += Math.max(0, Number(doc.waited_ms ?? 0));
    this.#deadline = startedMs + validityMs(this.#ttlMs, startedMs, startedMs);
    this.#refreshedAt = startedMs;
    this.#lostPromise = new Promise((resolve) => (this.#resolveLost = resolve));
  }

  /** The TTL the server granted at the last acquire or refresh. */
  get ttlMs(): number {
    return this.#ttlMs;
  }

  /** The performance.now() at which the lease's validity runs out. */
  get deadline(): number {
    return this.#deadline;
  }

  /**
   * Aborted, with a LostError as its reason, once the lease is lost. Pass it
   * to the work done under the lock. Reading it past the deadline loses the
   * lease first (see the class doc); a signal read before aborts when the
   * keep-alive's timer runs.
   */
  get signal(): AbortSignal {
    this.#expireIfDue();
    return this.#lost.signal;
  }

  /** Resolves with the LostError once the lease is lost; never rejects. Read past the deadline, it loses the lease first. */
  get lost(): Promise<LostError> {
    this.#expireIfDue();
    return this.#lostPromise;
  }

  /** Milliseconds the lease is still surely held; 0 once lost (past the deadline: lost now) or released. */
  validForMs(): number {
    if (this.#expireIfDue() || this.#releaseDone) return 0;
    return Math.max(0, this.#deadline - performance.now());
  }

  /**
   * Throws LostError if the lease is lost, its validity ran out (it is lost
   * then, at once: signal aborted, onLost called), or it was released: the
   * check to make right before each write. No substitute for the fence:
   * send the token too.
   */
  check(): void {
    if (this.#expireIfDue()) throw this.#lost.signal.reason;
    if (this.#releaseDone) throw new LostError(`lease of ${JSON.stringify(this.name)} was released: it no longer holds the lock`);
    if (performance.now() >= this.#deadline) throw new LostError(`lease of ${JSON.stringify(this.name)} ran out of validity`);
  }

  /** {"Fencing-Token": "<token>"} for a request to the protected resource. */
  fencingHeaders(): Record<string, string> {
    return { [FENCING_TOKEN_HEADER]: this.token.toString() };
  }

  /**
   * Extend the lease to ttlMs from now (default: the lease's TTL, ttlMs,
   * as the keep-alive does; it is sent, so fenced's default does not
   * apply). The validity is computed anew from this refresh: a shorter TTL
   * shortens it. Rejects with LostError (and aborts signal) if the lease is
   * no longer held, and without sending if it was lost, released or out of
   * validity before: a lease lost stays lost, even if the server still
   * holds it (release() frees that). So does one whose refresh is answered
   * after the validity the refresh granted, or after the keep-alive saw the
   * validity run out.
   *
   * A refresh that fails otherwise than by fenced's refusal (a 4xx with
   * its error code: HeldError, OutOfOrderError, …) may have been applied
   * all the same: no answer (TransportError), a 5xx (UnavailableError, a
   * proxy's 502 or 504), a 4xx page without a code, an answer that is not
   * JSON (docs/design.md, defect 114). The validity then ends no later
   * than this refresh would have made it end, so a shorter ttlMs that
   * failed shortens it too. A failed refresh that leaves no validity (so
   * shortened, or answered after the deadline) loses the lease at once, as
   * the Go client's Refresh does: signal aborts (with a LostError), lost
   * resolves and onLost is called before refresh() rejects with the
   * refresh's own error (defect 132).
   *
   * Each refresh carries a sequence number (nextRefreshSeq()), the same in
   * its resends, so that fenced never applies it after a later one: one
   * delayed on its way past its timeout cannot shorten the lease a later
   * refresh extended (defect 102). Rejects with OutOfOrderError if fenced
   * applied a later one first (another holder of the same lease): not
   * applied, the lease still held, the validity unchanged. Against an
   * older fenced, which refuses the unknown field seq, the refresh is sent
   * again at once without it (unordered, as before); the next tries seq again.
   */
  async refresh(ttlMs?: number): Promise<void> {
    // Without a TTL fenced would give its default, which the client does
    // not know: a longer lease would shrink, and one whose refresh went
    // unanswered would look valid past fenced's expiry (docs/design.md,
    // defect 113). Read when this refresh's turn comes: one before it may
    // change the TTL.
    await this.#oneAtATime(() => this.#refresh(ttlMs ?? this.#ttlMs, {}));
  }

  /**
   * Runs f after every refresh begun before it: each answer sets the
   * validity from its own start and TTL, so two in flight with different
   * TTLs could leave the one fenced did not apply last (as the Go client's
   * Lease does).
   */
  #oneAtATime(f: () => Promise<void>): Promise<void> {
    const run = this.#refreshing.then(f, f);
    this.#refreshing = run.catch(() => {});
    return run;
  }

  /**
   * half (the keep-alive): the refresh waits for half of the validity left,
   * at least 50 ms, not all of it: a connection gone silent (a frozen node,
   * a dropped route) must not use up the validity while a new one could
   * refresh; the keep-alive sends it again (docs/design.md, defect 110).
   */
  async #refresh(ttlMs: number | undefined, options: CallOptions, half = false): Promise<void> {
    const started = performance.now();
    // A lease lost, released or out of validity stays so: a refresh that
    // the server still answers does not make it held again.
    if (this.#lost.signal.aborted) throw this.#lost.signal.reason;
    if (this.#released || this.#releaseDone) {
      throw new LostError(`lease of ${JSON.stringify(this.name)} was released: it no longer holds the lock`);
    }
    if (started >= this.#deadline) {
      const err = new LostError(`lease of ${JSON.stringify(this.name)} ran out of validity before this refresh`);
      this.#signalLost(err);
      throw err;
    }
    const remaining = this.#deadline - started;
    const limit = half ? Math.min(Math.max(remaining / 2, 50), remaining) : remaining;
    const timeoutMs = remaining > 0 ? Math.min(this.#client.timeoutMs, Math.max(limit, 1)) : undefined;
    // Drawn once for this refresh, in the order refreshes are sent (one at
    // a time): the client's resends of it carry the same.
    const seq = nextRefreshSeq();
    // Requests sent: more than one, and an earlier one may have been applied (defect 260).
    let sends = 0;
    const onSend = () => sends++;
    let doc: Record<string, unknown>;
    try {
      try {
        doc = await this.#client.refreshID(this.name, this.leaseID, ttlMs, { ...options, timeoutMs, seq, onSend });
      } catch (e) {
        // An older fenced refuses the unknown field seq (400
        // invalid_argument, no field; this body is otherwise valid): send
        // it again at once without seq, unordered as before defect 102
        // (docs/design.md). Not remembered: the next refresh tries seq
        // again, so a server upgraded meanwhile orders it.
        if (!(e instanceof InvalidArgumentError && e.status === 400 && e.field === undefined)) throw e;
        sends = 0; // a fenced that refuses seq applied none of those
        doc = await this.#client.refreshID(this.name, this.leaseID, ttlMs, { ...options, timeoutMs, onSend });
      }
      if (typeof doc.token !== "bigint" || doc.token <= 0n || typeof doc.ttl_ms !== "number" || !Number.isSafeInteger(doc.ttl_ms) || doc.ttl_ms <= 0) {
        // A 200 with {} (a proxy, a wrong base URL): no answer of fenced's,
        // so maybe applied (below), and not "lost", as the Go client's
        // Refresh says it; the keep-alive tries again.
        throw new FencedError(`refresh ${JSON.stringify(this.name)}: the server's answer lacks token or ttl_ms`, 200);
      }
    } catch (e) {
      if (e instanceof LostError) this.#signalLost(e);
      // No answer, a 5xx or an answer not fenced's: the refresh may have
      // been applied, and a shorter TTL then ends the lease sooner there
      // (docs/design.md, defect 114). A refusal by fenced (a 4xx with its
      // code, out_of_order too: a later refresh was applied instead) was
      // not, unless an earlier attempt of it went out and may have been (a
      // handshake refused on a certificate after one: defect 260).
      else {
        if ((maybeApplied(e) || sends > 1) && ttlMs !== undefined) {
          this.#deadline = Math.min(this.#deadline, started + validityMs(ttlMs, started, started));
          this.#wakeKeepAlive?.(); // it sees the deadline
        }
        // A validity that ran out, shortened so or not, is a lease lost
        // now, as the Go client's Refresh says it (ErrExpired): signal
        // aborted, lost resolved and onLost called before this rejects,
        // not at the keep-alive's next wake (and, without a keep-alive,
        // never): docs/design.md, defect 132. The rejection is still the
        // refresh's own error.
        if (performance.now() >= this.#deadline) {
          const why = e instanceof Error ? e.message : String(e);
          this.#signalLost(new LostError(`lease of ${JSON.stringify(this.name)}: no successful refresh before its validity ran out (the last failed: ${why})`));
        }
      }
      throw e;
    }
    if (doc.token !== this.token) {
      const err = new LostError(`refresh of ${JSON.stringify(this.name)} answered token ${String(doc.token)}, not ${this.token}`);
      this.#signalLost(err);
      throw err;
    }
    this.#ttlMs = doc.ttl_ms as number;
    this.#deadline = started + validityMs(this.#ttlMs, started, started);
    this.#refreshedAt = started;
    this.#refreshes++;
    this.#wakeKeepAlive?.(); // it plans from this refresh (a shorter TTL: sooner)
    if (performance.now() >= this.#deadline) {
      // Answered later than the validity it granted: the lease may be gone
      // already, as if the refresh had not come.
      this.#signalLost(new LostError(`refresh of ${JSON.stringify(this.name)} answered after the validity it granted ran out`));
    }
    // Lost while the refresh was on its way (the keep-alive saw the validity
    // run out first): the loss is signalled once and stays.
    if (this.#lost.signal.aborted) throw this.#lost.signal.reason;
  }

  /**
   * Stop the keep-alive and release the lease; validForMs() is 0 and
   * check() throws after it. Calling it again once it succeeded does
   * nothing. Rejects with LostError if the lease was no longer held. Any
   * other error (TransportError, UnavailableError, a proxy's 502, … after
   * the client's retries) leaves the lease maybe still held: calling
   * release() again sends the release again, which is safe: it carries the
   * same release_id (drawn once per lease), so a lock held more than once
   * by its holder loses one hold, not two. Releases run one at a time, as
   * the Go client's: a release() called while one is in flight waits for
   * it, then resolves if it succeeded or sends again if it failed
   * (docs/design.md, defect 118).
   */
  release(): Promise<void> {
    // Not "begun, so done": a second call resolved at once while the first
    // could still fail and leave the lock held (defect 118).
    const run = this.#releasing.then(() => this.#release());
    this.#releasing = run.catch(() => {});
    return run;
  }

  async #release(): Promise<void> {
    await this.stopKeepAlive();
    if (this.#released) return; // the release before this one succeeded (or found the lease lost)
    this.#released = true;
    // Lost before: writes under it may have overlapped another holder's, so
    // say so even though the server answers a release of an already
    // released lease id with success (a retry after a lost reply).
    const lostBefore = this.#lost.signal.aborted ? (this.#lost.signal.reason as LostError) : undefined;
    this.#releaseID ??= randomBytes(16).toString("hex");
    let sends = 0;
    try {
      await this.#client.releaseID(this.name, this.leaseID, { releaseID: this.#releaseID, [countSends]: () => sends++ });
    } catch (e) {
      // Lost, answering a release sent again after an attempt that got no
      // answer (or a 503), by this call or an earlier one, before the
      // deadline: released, by that attempt. Another fenced node behind
      // the same URL knows nothing of it (with leases in etcd, each
      // remembers its own releases), and before its deadline nothing but
      // a release or a force-release takes a lease away (docs/design.md,
      // defect 97). Unless fenced is sure the lease was gone before any
      // release of it (maybe_released false: expired, force-released, lost
      // to a Redis restart): that is a loss, as in the Go client (defect
      // 190). True, or absent (a server before it), is forgiven.
      const released = e instanceof LostError && e.maybeReleased !== false && (sends > 1 || this.#unanswered) && performance.now() < this.deadline;
      if (!released) {
        if (e instanceof LostError) this.#signalLost(e);
        else {
          this.#released = false; // maybe still held: a later release() sends again
          // and maybe released: see above. Any failure but a refusal by
          // fenced, a proxy's 502 too (docs/design.md, defect 114). So too
          // when this call sent it before (sent again only after such a
          // failure), whatever the last attempt's error: a handshake
          // refused on a certificate now says nothing of the attempt that
          // went out before it (defect 260).
          if (maybeApplied(e) || sends > 1) this.#unanswered = true;
          else if ((e instanceof CertificateError || e instanceof ClientCertificateError) && !this.#unanswered) {
            // Nothing reached the server, by this call or before: it holds
            // the lock, for nobody, until its TTL runs out. Said, as the Go
            // client's Release says it.
            const Class = e.constructor as typeof CertificateError;
            throw new Class(
              `${e.message}: ${JSON.stringify(this.name)} not released: the release cannot be sent, and the lock stays ` +
                "held on the server until its TTL runs out", 0, undefined, undefined, { cause: e.cause });
          }
        }
        throw e;
      }
    }
    this.#releaseDone = true;
    if (lostBefore) throw lostBefore;
  }

  /**
   * Refresh the lease every ttl/3 with the TTL it was granted (or last
   * refreshed with: a refresh() meanwhile counts, and a shorter TTL brings
   * the next refresh forward). The first refresh is a third of the TTL
   * after the grant (or the latest refresh), however late keepAlive() is
   * called: at once if that is past. A refresh that answers lost, or a
   * validity that runs out without a successful refresh, aborts signal,
   * resolves lost and calls onLost once. Every other error (a 503, no
   * answer, a proxy's 502 page, a 401 while fenced reloads its tokens, an
   * out_of_order answer: another holder of the lease refreshed it later,
   * …) loses nothing: it is retried soon, within the validity left, as the
   * Go client's keep-alive does (docs/design.md, defect 115): after its
   * Retry-After, up to a third of the validity left, and never sooner than
   * min(ttl/10, 1 s) after the failure, so that no answer makes it a busy
   * loop (a Retry-After of 0 counts as none). But a refresh whose TLS
   * handshake fails on a certificate (CertificateError,
   * ClientCertificateError) fails so until someone changes one, and was not
   * sent: the lease is lost at once, with a LostError whose cause is that
   * error, and which says the server holds the lock until its TTL runs out.
   * An onLost that throws, or an async one whose promise rejects, is reported with
   * console.error and otherwise ignored (defect 133).
   * release() or stopKeepAlive() stops it.
   */
  keepAlive(options: { onLost?: (lease: Lease, err: LostError) => void } = {}): void {
    if (this.#loop) throw new Error("keepAlive: already running");
    if (this.#released) throw new Error("keepAlive: the lease was released");
    this.#onLost = options.onLost;
    this.#stop = new AbortController();
    this.#loop = this.#keepAlive(this.#stop.signal);
  }

  /** Stop the keep-alive, if running, and wait for it to end (an in-flight refresh is aborted). */
  async stopKeepAlive(): Promise<void> {
    this.#stop?.abort();
    await this.#loop;
  }

  async #keepAlive(stop: AbortSignal): Promise<void> {
    // A third of the TTL after the grant or the latest refresh, not after
    // this start: a keep-alive started later than that refreshes at once,
    // rather than sleep past the validity.
    let next = this.#refreshedAt + this.#ttlMs / 3;
    let seen = this.#refreshes;
    while (!stop.aborted && !this.#lost.signal.aborted) {
      if (this.#refreshes !== seen) {
        // Refreshed since (by this loop, or by refresh(), perhaps with a
        // shorter TTL): the next refresh is a third of the new TTL after it.
        seen = this.#refreshes;
        next = this.#refreshedAt + this.#ttlMs / 3;
      }
      // Sleep until the next refresh, or the deadline if that comes first;
      // a stop or a refresh meanwhile wakes it.
      const wake = new AbortController();
      const onStop = () => wake.abort();
      stop.addEventListener("abort", onStop);
      this.#wakeKeepAlive = onStop;
      try {
        await sleep(Math.max(0, Math.min(next, this.#deadline) - performance.now()), undefined, { signal: wake.signal });
      } catch {
        // woken: see why below
      } finally {
        stop.removeEventListener("abort", onStop);
        this.#wakeKeepAlive = undefined;
      }
      if (stop.aborted) return;
      if (this.#refreshes !== seen) continue; // plan from that refresh
      const now = performance.now();
      if (now >= this.#deadline) {
        this.#signalLost(new LostError(`lease of ${JSON.stringify(this.name)}: no successful refresh before its validity ran out`));
        return;
      }
      if (now < next) continue;
      try {
        // The TTL is read when its turn comes: a refresh before it may change it.
        await this.#oneAtATime(() => this.#refresh(this.#ttlMs, { retries: 0, signal: stop }, true)); // this loop retries, within the validity
      } catch (e) {
        if (stop.aborted || e instanceof LostError) return;
        if (e instanceof CertificateError || e instanceof ClientCertificateError) {
          // The handshake failed on a certificate, the server's or the
          // client's: every refresh fails so until someone changes one, and
          // nothing was sent. Retried until the deadline (as defect 115
          // retries any error), it told the holder only then; it gives the
          // lease up now, as the Go client's keep-alive does
          // (lock.ErrCannotSend). The server still holds the lock, until
          // its TTL runs out.
          this.#signalLost(new LostError(
            `lease of ${JSON.stringify(this.name)} lost: the keep-alive gave it up before its deadline, as its refresh ` +
              `cannot be sent (${e.message}); the lock stays held on the server until its TTL runs out`,
            0, undefined, undefined, { cause: e }));
          return;
        }
        // Any other error is retried until the deadline, as the Go
        // client's keep-alive does: a proxy's 502 or 504, a 500, a 401 or
        // 403 while fenced reloads its token file, a 404 or a page that is
        // not JSON lost the lease at once (docs/design.md, defect 115).
        // Only a lost answer or the validity's end loses it. Out of order:
        // not applied, the lease still held; the next refresh, with a
        // higher seq, is applied.
        // Retry soon, but not in a busy loop, and well within the validity
        // left: fenced's Retry-After (1 s) would outlast a short lease, so
        // it counts up to a third of what is left. Never sooner than
        // min(ttl/10, 1 s), as the Go client's keep-alive: no answer,
        // whatever it says, makes this a busy loop (a load balancer's 503
        // pages with Retry-After: 0 made it refresh hundreds of times a
        // second). The deadline still rules.
        const retryAfter = (e instanceof FencedError ? e.retryAfterMs : undefined) ?? 0;
        const floor = Math.min(this.#ttlMs / 10, MAX_KEEP_ALIVE_PAUSE_MS);
        const pause = Math.max(Math.min(retryAfter, (this.#deadline - performance.now()) / 3), floor);
        next = performance.now() + pause;
        continue;
      }
    }
  }

  /**
   * Loses the lease if its deadline has passed, as the keep-alive does at
   * the deadline (signal aborted, lost resolved, onLost called, once), and
   * says whether it is lost. Not a lease released (or being released): it
   * is no longer the caller's, and signal stays unaborted.
   */
  #expireIfDue(): boolean {
    if (this.#lost.signal.aborted) return true;
    if (this.#released || this.#releaseDone || performance.now() < this.#deadline) return false;
    // The keep-alive's words, as if it had found it.
    this.#signalLost(new LostError(`lease of ${JSON.stringify(this.name)}: no successful refresh before its validity ran out`));
    return true;
  }

  #signalLost(err: LostError): void {
    if (this.#lost.signal.aborted) return;
    this.#lost.abort(err);
    this.#resolveLost(err);
    try {
      // Typed as returning void, which an async function is too: its
      // promise, if it rejects, is reported as a throw is, not left
      // unhandled, which ends a Node process (docs/design.md, defect 133).
      const out: unknown = this.#onLost?.(this, err);
      if (typeof (out as PromiseLike<unknown> | undefined)?.then === "function") {
        (out as PromiseLike<unknown>).then(undefined, (e: unknown) => {
          console.error(`fenced: onLost callback for lock ${JSON.stringify(this.name)} rejected:`, e);
        });
      }
    } catch (e) {
      // Not the caller's error: the refresh(), release() or keep-alive that
      // found the loss goes on as if onLost had returned (a throw here would
      // reject the keep-alive's promise, unhandled, and end the process).
      console.error(`fenced: onLost callback for lock ${JSON.stringify(this.name)} threw:`, e);
    }
  }
}
