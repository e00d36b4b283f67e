"""Python client of fenced's HTTP API (v1): leases with fencing tokens.

Standard library only (urllib, json, threading). A lock is held through a
lease; send the lease's token with every write to the protected resource
(the Fencing-Token header, see set_fencing_token, or fence_admit in
Postgres), so that the resource can reject a writer whose lease was lost::

    import fenced

    client = fenced.Client("http://127.0.0.1:7070")
    with client.lock("invoice-42", ttl_ms=10_000) as lease:  # kept alive
        write(lease.token)          # the resource admits tokens >= the highest it saw
        lease.check()               # raises LostError once the lease is lost

Errors are typed by the API's error code (never by message text): HeldError
(409 held; its subclass TTLTooShortError, a 503 on ttl_ms: not acquired,
nobody holds the lock), LostError (410 lost), InvalidArgumentError (400),
... all subclasses of FencedError. UnavailableError (503) and
TransportError (no answer) are retryable.

Every acquire or campaign sends a waiter, 32 lowercase hex digits drawn once per
call: the key to a grant whose answer was lost, and a fair waiting call's
place in the server's queue (one attempt, wait_ms 0, and an unfair acquire
have none). Such a call is asked again, with the same
waiter, after a 503, after its answer was lost (the connection closed or
reset once the request was sent), or after an answer that is not fenced's
decision (a proxy's 502 or 504 page, a 500, a body that is not JSON:
docs/design.md, defect 119): the server hands back the grant it made
for that waiter, the same lease id and token, instead of leaving a lease
nobody knows to hold the lock until its TTL. One attempt (wait_ms 0) is
asked again up to retries times; a waiting call rides out every failure
without fenced's decision (those, a refused connection, a timeout: a fenced
restarting) until its wait ends, whatever retries says, as the Go client
does (docs/design.md, defect 130). A request asked again waits only what
is left of wait_ms: the call as a whole waits no longer than it was asked
to (but for one last request, at once and with wait_ms 1, after an answer
lost, or a proxy's page, when the wait is over: it may have been a grant).

Every refresh sends a seq (next_refresh_seq), drawn once per refresh and
sent again with it: fenced applies no refresh of a lease below the highest
seq it applied, so a refresh delayed on its way after its caller gave up
cannot shorten the lease a later refresh extended (OutOfOrderError, 409).
"""

from __future__ import annotations

import copy
import functools
import http.client
import inspect
import io
import ipaddress
import json
import logging
import math
import os
import random
import secrets
import select
import socket
import ssl
import threading
import time
import unicodedata
import urllib.parse
import urllib.request
import weakref
from typing import Any, Callable, Iterator, MutableMapping, Optional, Union

__all__ = [
    "Client",
    "Lease",
    "LockState",
    "LockPage",
    "Leader",
    "FencedError",
    "InvalidArgumentError",
    "UnauthenticatedError",
    "ForbiddenError",
    "NotFoundError",
    "MethodNotAllowedError",
    "HeldError",
    "HeldByOtherError",
    "TTLTooShortError",
    "LostError",
    "OutOfOrderError",
    "PayloadTooLargeError",
    "UnsupportedMediaTypeError",
    "UnavailableError",
    "TransportError",
    "CertificateError",
    "ClientCertificateError",
    "RedirectError",
    "FENCING_TOKEN_HEADER",
    "MAX_TOKEN",
    "MAX_LABEL_BYTES",
    "MAX_LIST_LIMIT",
    "next_refresh_seq",
    "set_fencing_token",
    "validity",
]

#: The HTTP header that carries a fencing token to a protected resource, in
#: decimal. See docs/fencing-token-http.md.
FENCING_TOKEN_HEADER = "Fencing-Token"

#: The largest token fenced issues: 2^63-1, what a signed 64-bit integer or a
#: Postgres bigint holds.
MAX_TOKEN = (1 << 63) - 1

#: The longest owner label, in bytes of UTF-8 (API schema Label).
MAX_LABEL_BYTES = 128

#: The most locks one page of list_locks holds (the API's limit maximum).
MAX_LIST_LIMIT = 1000


# ---------------------------------------------------------------------------
# Errors


class FencedError(Exception):
    """An error answer of the API, or no answer.

    code is the API's error code ("held", "lost", ...; None when the server
    did not answer with an API error), status the HTTP status (0 without an
    answer), message the server's explanation.
    """

    code: Optional[str] = None
    retryable = False
    #: The request field the server refused (API field "field": "wait_ms",
    #: "ttl_ms", ...), or None.
    field: Optional[str] = None
    #: On a refused wait_ms, the longest wait the server allows (its
    #: --max-wait; API field max_wait_ms), or None.
    max_wait_ms: Optional[int] = None
    #: On the HeldError that ends a wait (acquire, elect with wait_ms): how
    #: long the call waited, in milliseconds, from its start to the 409,
    #: across all its requests (a wait longer than the server's --max-wait
    #: takes several), as the Go client's lock.WaitError; and its place in
    #: the lock's queue then, as the last 409 that had one said (API fields
    #: waited_ms, position; 1 is the head; 0: it had none, an unfair wait;
    #: None when no answer said). The message says the same numbers.
    waited_ms: Optional[int] = None
    position: Optional[int] = None
    # An acquire's or campaign's answer of 200 that lacks a lease's fields
    # (Client._granted): raised as it is, as the Go client's adopt, and
    # given up on by no further request.
    _no_lease = False

    def __init__(self, message: str, status: int = 0, code: Optional[str] = None,
                 retry_after: Optional[float] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        if code is not None:
            self.code = code
        #: Seconds the server asked to wait before retrying (Retry-After: a
        #: whole number above 0, as the Go client takes it), or None; a
        #: Retry-After of 0, negative, a fraction or a date counts as none.
        self.retry_after = retry_after

    def __str__(self) -> str:
        if self.code:
            return f"fenced: {self.code} ({self.status}): {self.message}"
        if self.status:
            return f"fenced: HTTP {self.status}: {self.message}"
        return f"fenced: {self.message}"


class InvalidArgumentError(FencedError):
    """400 invalid_argument: a bad lock name, body, ttl_ms, wait_ms or lease id."""
    code = "invalid_argument"


class UnauthenticatedError(FencedError):
    """401 unauthenticated: a missing or wrong bearer token."""
    code = "unauthenticated"


class ForbiddenError(FencedError):
    """403 forbidden: the bearer token is known but may not do this, or not
    to this lock (its permissions or lock name prefixes); the message says
    what it may do."""
    code = "forbidden"


class NotFoundError(FencedError):
    """404 not_found: no such path (a wrong base URL, or an older fenced)."""
    code = "not_found"


class MethodNotAllowedError(FencedError):
    """405 method_not_allowed."""
    code = "method_not_allowed"


class HeldError(FencedError):
    """409 held: another holder has the lease (still, after wait_ms)."""
    code = "held"


class HeldByOtherError(HeldError):
    """409 held, from force_release(name, token=N): the lock is held by a
    grant whose token is not N, and nothing was released. token is the
    token of the grant that holds it (0 while a Redis acquisition has not
    recorded its token yet)."""
    #: The token of the grant that holds the lock instead.
    token: int = 0


class TTLTooShortError(HeldError):
    """Not acquired, though nobody holds the lock: the grant came back with
    no validity left (its TTL ran out, less the drift kept, before it was
    granted), so it was released; a longer ttl_ms is what helps. fenced
    answers it 503 unavailable with field "ttl_ms" (code "unavailable",
    status 503; docs/design.md, defect 182), and its message, kept as it
    is, says how long the grant took; the client raises it too, status 0,
    for a grant whose answer came after its TTL ran out here (defect 117).
    A HeldError, as the Go client's lock.ErrTTLTooShort matches
    lock.ErrNotAcquired: try_acquire returns None, and a wait goes on
    while it has time left, after the same pause as after held (not the
    503's Retry-After), and raises it if it ends with one."""
    field: Optional[str] = "ttl_ms"


class LostError(FencedError):
    """410 lost: this lease id no longer holds the lease; stop writing with its token.

    The keep-alive also reports a lease whose validity ran out without a
    successful refresh as a LostError (status 0).
    """
    code = "lost"
    #: On the 410 of a release (API field maybe_released): True when the
    #: store cannot tell this "not held" from the answer to an earlier
    #: release of the same lease whose answer was lost; False when it is
    #: sure the lease was gone before this release (expired,
    #: force-released, lost to a Redis restart); None when the answer did
    #: not say (a server before it, another request, the client's own).
    maybe_released: Optional[bool] = None


class OutOfOrderError(FencedError):
    """409 out_of_order: a refresh of this lease with a higher seq was
    applied first, so this one was not applied. The lease is still held,
    as that later refresh left it: not lost, and the validity stays as it
    was. A refresh delayed on its way past a later one meets it, and so
    does one of a Lease whose lease id another refreshed (see
    next_refresh_seq)."""
    code = "out_of_order"


class PayloadTooLargeError(FencedError):
    """413 payload_too_large."""
    code = "payload_too_large"


class UnsupportedMediaTypeError(FencedError):
    """415 unsupported_media_type."""
    code = "unsupported_media_type"


class UnavailableError(FencedError):
    """503 unavailable: Redis or etcd failed or did not answer, or fenced is
    shutting down. Retryable, after retry_after seconds if the server said."""
    code = "unavailable"
    retryable = True


class TransportError(FencedError):
    """No answer from fenced: connection refused or reset, or a timeout.
    Retryable; whether the request took effect is unknown."""
    retryable = True
    # The request went out whole and its answer did not all come within
    # its timeout (_timed_out_sent).
    _timed_out_sent = False


class CertificateError(FencedError):
    """The TLS handshake failed on the server's certificate: signed by a CA
    the client does not trust (a private CA not given in ssl_context), or
    not issued for the host name in base_url. Nothing was sent by the
    attempt that raised it (a refresh or release sent again after its
    answer was lost may have been applied by the attempt before). Not
    retryable, and not a TransportError: sent again it fails the same way,
    and a waiting acquire raises it at once rather than ride it out as a
    fenced restarting until its wait is over. The message says what to do.
    A keep-alive whose refresh fails so gives the lease up at once (its
    LostError's __cause__ is this error): no refresh will get through.
    """


class ClientCertificateError(FencedError):
    """The server refused the TLS handshake over the client's own
    certificate (mutual TLS, fenced serve --tls-client-ca): the client
    presented none (ssl_context without load_cert_chain), or one the server
    does not trust (signed by another CA, expired, not for client
    authentication). The server says so with a TLS alert (certificate
    required, unknown CA, bad certificate, certificate expired, ...; a TLS
    1.2 server that got none answers a handshake failure, which counts
    too), under TLS 1.3 after the client's side of the handshake is over,
    when the request was already written: the server did not read it, so
    nothing was applied. Handled as CertificateError is (not retryable, not
    a TransportError, not sent again nor waited out, a keep-alive gives its
    lease up at once), but a sibling, not a subclass: it is the client's
    certificate, not the server's, and the remedy differs (a certificate
    and key in ssl_context's load_cert_chain, not a CA in its cafile). The
    message says what to do; __cause__ is the ssl.SSLError with the alert.
    """


class RedirectError(FencedError):
    """A redirect (3xx), which fenced never sends: something in front of it
    (an ingress that sends http:// to https://, a moved load balancer)
    answered, and the client follows no redirect. Nothing was applied, and
    the request is not sent again: point the client at the URL the message
    names (location less the request's path). location is the Location
    header, or "" without one. Not retryable, and no code: not the API's
    error."""

    #: The Location the redirect pointed at, or "".
    location: str = ""


_log = logging.getLogger("fenced")

_ERRORS = {cls.code: cls for cls in (
    InvalidArgumentError, UnauthenticatedError, ForbiddenError, NotFoundError, MethodNotAllowedError,
    HeldError, LostError, OutOfOrderError, PayloadTooLargeError, UnsupportedMediaTypeError, UnavailableError,
)}


# ---------------------------------------------------------------------------
# Fencing-Token header


def _check_token(token: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= MAX_TOKEN:
        raise ValueError(f"fencing token {token!r}: want an int from 1 to {MAX_TOKEN}")
    return token


def set_fencing_token(headers: Union[MutableMapping[str, str], urllib.request.Request], token: int) -> None:
    """Set the Fencing-Token header to token, in decimal, on a dict of
    headers or a urllib.request.Request: the contract of
    docs/fencing-token-http.md. The header under any other spelling
    ("fencing-token", and a Request's unredirected one) is replaced: a
    request carries exactly one. A token outside 1 to 2^63-1 is a ValueError."""
    value = str(_check_token(token))
    # Header names are case-insensitive, but a dict's keys are not: one
    # left under another spelling went out beside this one, and the
    # resource refused the two (docs/design.md, defect 176, in Go). urllib
    # sends a Request's unredirected header in preference to its own.
    if isinstance(headers, urllib.request.Request):
        for held in (headers.headers, headers.unredirected_hdrs):
            _drop_fencing_token(held)
        headers.add_header(FENCING_TOKEN_HEADER, value)
    else:
        _drop_fencing_token(headers)
        headers[FENCING_TOKEN_HEADER] = value


def _drop_fencing_token(headers: MutableMapping[str, str]) -> None:
    """Delete the Fencing-Token header from headers under every spelling."""
    for key in [k for k in headers.keys() if k.lower() == FENCING_TOKEN_HEADER.lower()]:
        try:
            del headers[key]
        except KeyError:  # a case-insensitive mapping deleted it with an earlier spelling
            pass


# ---------------------------------------------------------------------------
# Checks made before sending


def _invalid(field: str, message: str) -> InvalidArgumentError:
    """The InvalidArgumentError the server would answer, raised by the
    client itself (status 0): callers catch one class either way."""
    e = InvalidArgumentError(message, 0)
    e.field = field
    return e


#: The general categories that no version of Unicode calls printable (Go's
#: unicode.IsPrint, which lock.ValidateLabel uses): controls, format
#: characters, surrogates, private use, and separators but the ASCII space.
#: A character Python's tables do not know (Cn) is sent for the server to
#: decide: str.isprintable() refused U+1F6DC, a symbol of Unicode 15.0 the
#: server takes, where Python 3.11's tables are 14.0 (docs/design.md,
#: defect 207).
_NOT_PRINTABLE = frozenset(("Cc", "Cf", "Cs", "Co", "Zl", "Zp", "Zs"))


#: The shortest bearer token a server takes (the Go server.MinTokenLen).
_MIN_TOKEN_BYTES = 16


def _check_bearer_token(token: Any) -> None:
    """A ValueError unless token is one a server's token file can hold: at
    least 16 bytes of printable ASCII without spaces, as the Go client's
    WithBearerToken wants. Any other failed every call with a 401, or one
    with a line break at the first call in http.client (docs/design.md,
    defect 208). The error never shows the token: it is a secret."""
    want = (f"want a str of at least {_MIN_TOKEN_BYTES} bytes of printable ASCII without spaces, "
            "as a server's token file holds them (None or \"\": send none)")
    if not isinstance(token, str):
        raise ValueError(f"bearer_token: a {type(token).__name__}; {want}")
    bad = next((i for i, c in enumerate(token) if not "\x21" <= c <= "\x7e"), None)
    if bad is not None:
        raise ValueError(f"bearer_token has U+{ord(token[bad]):04X} at character {bad}; {want}")
    if len(token) < _MIN_TOKEN_BYTES:
        raise ValueError(f"bearer_token of {len(token)} bytes; {want}")


def _check_label(field: str, value: Any) -> str:
    """value if it is a label the API takes (schema Label: 1 to 128 bytes
    of printable UTF-8, the Go client's lock.ValidateLabel), else an
    InvalidArgumentError naming field, before anything is sent: an owner
    is for people, and a bad one is better refused where it is written. A
    character Python's tables do not know is the server's to judge
    (_NOT_PRINTABLE)."""
    want = f"want 1 to {MAX_LABEL_BYTES} bytes of printable UTF-8"
    if not isinstance(value, str):
        raise _invalid(field, f"{field} {value!r}: {want}")
    if value == "":
        raise _invalid(field, f"{field}: empty; {want}")
    try:
        n = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _invalid(field, f"{field}: not UTF-8 (a lone surrogate); {want}") from None
    if n > MAX_LABEL_BYTES:
        raise _invalid(field, f"{field}: {n} bytes; {want}")
    bad = next((c for c in value if c != " " and unicodedata.category(c) in _NOT_PRINTABLE), None)
    if bad is not None:
        raise _invalid(field, f"{field}: has {bad!r} at character {value.index(bad)}; {want}")
    return value


def _check_wait(wait_ms: Any) -> int:
    """wait_ms if it is a wait the client can ask for (an int of
    milliseconds, 0 or more; a longer wait than the server's --max-wait goes
    in several requests), else an InvalidArgumentError before anything is
    sent: a float went out rounded, True as 1 ms, and a str failed with a
    TypeError."""
    if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or wait_ms < 0:
        raise _invalid("wait_ms", f"wait_ms {wait_ms!r}: want an int of milliseconds, 0 or more "
                                  "(0 makes one attempt)")
    return wait_ms


# ---------------------------------------------------------------------------
# Refresh sequence numbers

_seq_mu = threading.Lock()
_last_seq = 0  # the last seq next_refresh_seq returned


def next_refresh_seq() -> int:
    """A refresh sequence number (API field seq) higher than every one this
    process drew before: the microseconds since the Unix epoch, or the last
    one plus 1 when the clock has not moved on (or went back), as the Go
    client's lock.NextRefreshSeq. Every Lease numbers its refreshes with it.
    From the clock, so that a process that refreshes a lease after another
    (a restarted one, with its lease id) starts above the other's, as long
    as their clocks agree better than the time between their refreshes; one
    counter per process, so that Leases sharing a lease id (a reentrant
    holder's) are ordered too. Below 2^53-1, the API's maximum, until the
    year 2255."""
    global _last_seq
    now = max(time.time_ns() // 1000, 0)
    with _seq_mu:
        _last_seq = max(now, _last_seq + 1)
        return _last_seq


# ---------------------------------------------------------------------------
# Validity


def validity(ttl_ms: int, started: float, now: float) -> float:
    """The seconds a lease granted ttl_ms stays valid at monotonic time now,
    when the request that granted it was sent at started:
    ttl - (now - started) - drift, with drift = ttl/100 + 2 ms (the rule of
    fenced's design). Not positive: the lease may be gone."""
    ttl = ttl_ms / 1000.0
    return ttl - (now - started) - (ttl / 100.0 + 0.002)


# ---------------------------------------------------------------------------
# Client


class LockState:
    """What GET /v1/locks/{name} says of a lock (API schema LockState).

    name; held; token, the holder's fencing token (0 when not held);
    ttl_ms, how long the lease has left (at least 1 while held, 0 when not);
    owner, the owner label given at acquisition ("" when none, or free);
    count, the releases to go (1, or more for a reentrant holder's; 0 when
    free); last_token, for a free lock, the token of the lease that held it
    last while the store still remembers (until that lease's TTL would have
    run out; 0 otherwise); waiters, how many wait in the lock's queue;
    oldest_wait_ms, how long the one at its head has waited. Never the lease
    id nor the reentrant holder identity.
    """

    def __init__(self, name: str, held: bool, token: int, ttl_ms: int, owner: str = "",
                 count: int = 0, last_token: int = 0, waiters: int = 0, oldest_wait_ms: int = 0):
        self.name, self.held, self.token, self.ttl_ms = name, held, token, ttl_ms
        self.owner, self.count, self.last_token = owner, count, last_token
        self.waiters, self.oldest_wait_ms = waiters, oldest_wait_ms

    @classmethod
    def _from_answer(cls, doc: dict[str, Any]) -> "LockState":
        held = doc["held"]
        # The API leaves out count 1, owner and last_token when there is none.
        return cls(doc["name"], held, doc["token"], doc["ttl_ms"], owner=doc.get("owner", ""),
                   count=doc.get("count", 1 if held else 0), last_token=doc.get("last_token", 0),
                   waiters=doc.get("waiters", 0), oldest_wait_ms=doc.get("oldest_wait_ms", 0))

    def __repr__(self) -> str:
        return (f"LockState(name={self.name!r}, held={self.held}, token={self.token}, ttl_ms={self.ttl_ms}, "
                f"owner={self.owner!r}, count={self.count}, last_token={self.last_token}, "
                f"waiters={self.waiters}, oldest_wait_ms={self.oldest_wait_ms})")


class LockPage:
    """One page of list_locks (API schema LockList): locks, the LockStates
    of held locks, and next_cursor, to pass as cursor for the next page;
    "" after the last."""

    def __init__(self, locks: list[LockState], next_cursor: str = ""):
        self.locks, self.next_cursor = locks, next_cursor

    def __repr__(self) -> str:
        return f"LockPage(locks={self.locks!r}, next_cursor={self.next_cursor!r})"


class Leader:
    """What GET /v1/elections/{name} says: whether someone leads, its value,
    and its term (a fencing token; 0 when nobody leads)."""

    def __init__(self, name: str, leading: bool, value: str, token: int):
        self.name, self.leading, self.value, self.token = name, leading, value, token

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Leader) and (self.name, self.leading, self.value, self.token) == (
            other.name, other.leading, other.value, other.token)

    def __repr__(self) -> str:
        return f"Leader(name={self.name!r}, leading={self.leading}, value={self.value!r}, token={self.token})"


def _redacted(raw: str, u: urllib.parse.SplitResult) -> str:
    """raw with the password of its user info, if any, replaced by "xxxxx",
    as Go's url.URL.Redacted shows a URL: for the constructor's errors,
    which must not print a secret (docs/design.md, defect 162)."""
    if not isinstance(raw, str):
        return raw
    userinfo, at, hostport = u.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return raw
    user = userinfo.split(":", 1)[0]
    return raw.replace(u.netloc, f"{user}:xxxxx@{hostport}", 1)


class Client:
    """A client of one fenced server.

    base_url: like "http://127.0.0.1:7070" or "https://fenced.example/prefix";
    one with a user (or user:password), a query or a fragment is refused
    with ValueError, as the Go client refuses it (the error shows a
    password as "xxxxx"). bearer_token: sent as
    "Authorization: Bearer ..." when the server requires one (default None
    or "": none); at least 16 bytes of printable ASCII without spaces, as
    a server's token file holds them. Bad arguments here raise ValueError.
    timeout: seconds a request may take as a whole, the host name's
    lookup, connecting (and the TLS handshake), sending and reading all of
    its answer, on top of an acquire's wait_ms (default 10). retries: how
    often a 503 unavailable answer is retried, after the answer's
    Retry-After (at most 1 s) or 100 ms, 200 ms, ...
    (default 2; 0 disables); a one-attempt acquire, a refresh or release
    (and a force-release with a token) also retries, within the same count,
    a request whose answer was lost or was not fenced's decision, such as a
    proxy's 502 page, after its Retry-After if it has one (see Client._send).
    A waiting acquire or campaign (wait_ms > 0) does not count: it rides out
    such failures until its wait ends (see acquire).
    A Client is safe to share between threads. Each thread keeps one
    connection to the server open between its calls (HTTP keep-alive), so a
    call costs no new TCP (or TLS) handshake; close() closes every
    thread's, and a thread's connection closes with the thread: when it
    ends, not at close(), so short-lived threads leave no socket open
    (as a threading.local's value goes when its thread ends, and only a
    reference cycle through it delays that to a garbage collection).
    ssl_context: for an https base_url, the ssl.SSLContext of its
    connections (default None: ssl.create_default_context(), the system's
    CAs): ssl.create_default_context(cafile="ca.pem") trusts a private CA,
    and its load_cert_chain(...) sends a client certificate (fenced's
    --tls-client-ca). A certificate the context does not trust raises
    CertificateError, at once; a client certificate the server refuses
    (none, or one it does not trust) ClientCertificateError, at once.
    """

    def __init__(self, base_url: str, bearer_token: Optional[str] = None,
                 timeout: float = 10.0, retries: int = 2,
                 ssl_context: Optional[ssl.SSLContext] = None):
        u = urllib.parse.urlsplit(base_url)
        shown = _redacted(base_url, u)  # the URL in errors, without its password
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"base_url {shown!r}: want http(s)://host:port")
        if "@" in u.netloc or "?" in base_url or "#" in base_url:
            # As the Go client refuses them: credentials in the URL were
            # never sent, and a query or fragment never applied (http.client
            # dropped them in silence). An empty "?" or "#" too: it adds
            # nothing, and a client that joins paths to the URL as text
            # (the TypeScript one) would send every path as the query.
            raise ValueError(f"base_url {shown!r}: want no user, query or fragment")
        try:  # urlsplit takes any digits; a bad port would fail at the first call
            port = u.port
        except ValueError:
            port = -1
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"base_url {shown!r}: port: want a number from 1 to 65535")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"timeout {timeout!r}: want a number of seconds > 0")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries {retries!r}: want an int >= 0")
        if bearer_token is not None and bearer_token != "":  # "" sends none, as None does
            _check_bearer_token(bearer_token)
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise ValueError(f"ssl_context {ssl_context!r}: want an ssl.SSLContext or None")
        self._ssl_context = ssl_context
        self.base_url = base_url.rstrip("/")
        self._url = u
        # .holder: this thread's _ConnHolder, whose slot has its
        # connection. The holder goes when the thread ends (its local dict
        # with it), and its finalizer closes the connection then
        # (_close_ended): a set of every connection alone kept those of
        # ended threads open until close(), one socket per thread.
        self._local = threading.local()
        # Every thread's connection, for close(): those a call is using
        # (busy) close as it returns, the others at once; a connection of an
        # older generation than the client's was closed by close().
        self._conns_mu = threading.Lock()
        self._conns: set[http.client.HTTPConnection] = set()
        self._busy: set[http.client.HTTPConnection] = set()
        # Connections of ended threads that their finalizer closed but could
        # not take out of _conns (it found _conns_mu taken): the next holder
        # of the lock takes them out (_reap).
        self._dead: list[http.client.HTTPConnection] = []
        self._gen = 0
        self._bearer = bearer_token
        self.timeout = timeout
        self.retries = retries
        # The least --max-wait a server said (max_wait_ms): a longer wait
        # is asked for in requests of this length. None until one said.
        self._max_wait_ms: Optional[int] = None

    # -- the API -----------------------------------------------------------

    def try_acquire(self, name: str, ttl_ms: Optional[int] = None,
                    holder: Optional[str] = None, owner: Optional[str] = None) -> Optional["Lease"]:
        """One attempt to take the lock: a Lease, or None if another holder
        has it (or the grant came with no validity left, see acquire).
        ttl_ms None means the server's default TTL (30 s unless configured);
        holder and owner as in acquire. One attempt takes a free lock
        whoever waits, so it takes no unfair. Its request carries a waiter
        with no place in the queue: one whose answer was lost, or was a
        proxy's page (defect 119), is sent again, up to retries times, and
        gets the grant the first one made (the same lease id and token); so
        is one the client's timeout ended once it was sent, and after the
        last, one attempt under the waiter releases the grant (see
        acquire)."""
        try:
            return self.acquire(name, ttl_ms=ttl_ms, wait_ms=0, holder=holder, owner=owner)
        except HeldError:
            return None

    def acquire(self, name: str, ttl_ms: Optional[int] = None, wait_ms: int = 30_000,
                holder: Optional[str] = None, owner: Optional[str] = None,
                unfair: bool = False) -> "Lease":
        """Take the lock, waiting up to wait_ms (default 30 s) for the holder
        to release it or for its lease to expire; a wait longer than the
        server's --max-wait (60 s by default) goes in several requests, one
        place in the queue. Raises HeldError if it is still held then: when
        wait_ms is over, not before. A 409 that comes with time left
        (something in front of fenced answering for it, a fenced
        restarting) is asked again after a pause (50 ms doubling to 1 s,
        never past the wait's end), with the same waiter, for what is left,
        as the Go client does (docs/design.md, defect 242); the HeldError's
        waited_ms is the whole call's wait.
        A grant answered after its TTL ran out (no validity left: a slow
        proxy, a pause of this process) is released at once and not
        acquired: the call waits on if time is left, else raises
        TTLTooShortError (a HeldError) saying so (docs/design.md, defect
        117). So does fenced's 503 unavailable on ttl_ms, its word for a
        grant with no validity left (defect 182): TTLTooShortError with the
        server's message, which says how long the grant took; a wait asks
        again after it as after a 409, not after its Retry-After. ttl_ms
        None means the server's default TTL. The granted TTL may be longer
        (etcd leases are whole seconds): see Lease.ttl_ms.

        holder (API field holder; default None: not reentrant) makes the
        acquisition reentrant: an acquire by the holder that holds the lock
        now, from this process or another, gets the same lease id and token
        at once, with Lease.count one more, and the lock is freed by as many
        releases. It is an identity of the caller's choosing, 1 to 128 bytes
        of printable UTF-8 (the server refuses anything else:
        InvalidArgumentError), and a credential as good as the lease id:
        whoever sends it gets the lease id, so the API never shows it. Pick
        an unguessable one, such as secrets.token_hex(16) drawn once per
        logical holder, and never log it.

        owner (API field owner; default None: none) is a label for people,
        such as "billing-7f9c on host-a", that inspect and list_locks show
        while the lease holds the lock; unlike holder it is no secret. 1 to
        128 bytes of printable UTF-8: anything else raises
        InvalidArgumentError (field "owner") without sending.

        unfair (API field unfair; default False) waits without a place in
        the lock's queue: the lock goes to this call whenever it finds it
        free, whoever has waited longer. Its waiter has no place in the
        queue, but finds its grant after a lost answer as below. With
        wait_ms 0 it changes nothing, and is not sent: one attempt takes a
        free lock whoever waits.

        The request carries a waiter (32 lowercase hex digits, new for each call; a
        place in the queue when the call waits and is fair), and a request
        whose answer was lost after it was
        sent (the connection closed or reset: TransportError), or answered
        other than by fenced's decision (a 5xx other than 503, such as a
        proxy's 502 or 504 page, or an answer without an API error code:
        fenced may have granted it; docs/design.md, defect 119), is sent
        again, as a 503 is: the server answers it with the grant it made
        for the first, the same lease id and token; so is one the client's
        own timeout ended once it was sent, its answer maybe a grant on the
        way (docs/design.md, defect 239). With wait_ms 0 (try_acquire) it
        is sent again up to retries times, then the error is raised, once
        one attempt under the waiter (wait_ms 0, within about 1 s) found
        and released the grant, if any, as below for a call cut short. A
        wait rides out these, and every other failure without
        fenced's decision (a refused connection, a timeout: a fenced
        restarting), until wait_ms is over, whatever retries says, as the
        Go client does (docs/design.md, defect 130): after a pause (the
        answer's Retry-After, at most 1 s, or 100 ms more each time, with
        jitter; never past the wait's end) the next request, with the same
        waiter, waits what is left of wait_ms. Once the wait is over the
        error is raised; but after a lost answer, a proxy's page or a
        timeout once sent, one more request goes at once, with wait_ms 1,
        to find a grant made in the wait's last moments, and if that one
        gets no answer of fenced's either, the give-up below. fenced's
        refusals (a 4xx with an API error code: 400, 401, 403, ...) end the
        call at once.

        A fair wait its caller cuts short, by an exception that is not
        fenced's in a request or a pause (KeyboardInterrupt: Ctrl-C,
        SystemExit, an OSError of its own such as a TimeoutError subclass
        that a signal handler raises: only the standard library's, of
        builtins, socket, ssl or http.client, are a request's failure,
        TransportError), gives its place in the queue up before that
        exception is raised: one more request with the waiter, final and
        of 1 ms, within about 1 s, which releases a grant it finds, as the
        Go client does for a cancelled context; otherwise the place would
        stand 3 s in front of later waiters of a lock that may be free
        (docs/design.md, defect 134). close() cuts no call short: a wait
        in another thread goes on, on a new connection."""
        body: dict[str, Any] = {}
        if ttl_ms is not None:
            body["ttl_ms"] = ttl_ms
        if _check_wait(wait_ms):
            body["wait_ms"] = wait_ms
        if holder is not None:
            body["holder"] = holder
        if owner is not None:
            body["owner"] = _check_label("owner", owner)
        if unfair and wait_ms > 0:  # the server refuses unfair with one attempt
            body["unfair"] = True
        return self._take(name, "/acquire", body, wait_ms, "locks")

    def lock(self, name: str, ttl_ms: Optional[int] = None, wait_ms: int = 30_000,
             on_lost: Optional[Callable[["Lease", FencedError], None]] = None,
             holder: Optional[str] = None, owner: Optional[str] = None,
             unfair: bool = False) -> "Lease":
        """acquire, then keep the lease alive: for a with statement, which
        releases the lease on exit (one hold, for a reentrant holder).
        on_lost(lease, error) is called once if the lease is lost, from the
        thread that finds out (usually the keep-alive's); if it raises, its
        error is logged (logger "fenced"). It must be a plain function: an
        async def one is never run (logged as an error; see keep_alive).
        holder, owner and unfair as in acquire."""
        lease = self.acquire(name, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder, owner=owner, unfair=unfair)
        lease.keep_alive(on_lost=on_lost)
        return lease

    def elect(self, name: str, value: Optional[str] = None, ttl_ms: Optional[int] = None,
              wait_ms: int = 30_000) -> "Lease":
        """Campaign in the election name, waiting up to wait_ms to lead
        (candidates are served in the order they began); raises HeldError if
        another still leads then (TTLTooShortError, a HeldError, if the
        term came back with no validity left: see acquire). The Lease is
        the leadership: its token is the term, to send with every write;
        release() resigns. value is what leader() shows of the leader,
        such as its address; None or "" is none (leader() shows ""), as in
        the Go client. The server must
        keep its leases in etcd: on Redis leases it answers
        InvalidArgumentError. A lost answer is asked again as in acquire."""
        body: dict[str, Any] = {}
        if ttl_ms is not None:
            body["ttl_ms"] = ttl_ms
        if _check_wait(wait_ms):
            body["wait_ms"] = wait_ms
        # "" is no value, left out as the Go client's Elect leaves it: the
        # API refuses an empty one, which leader() shows for none anyway
        # (docs/design.md, defect 135).
        if value is not None and value != "":
            body["value"] = value
        return self._take(name, "/campaign", body, wait_ms, "elections")

    def lead(self, name: str, value: Optional[str] = None, ttl_ms: Optional[int] = None,
             wait_ms: int = 30_000, on_lost: Optional[Callable[["Lease", FencedError], None]] = None) -> "Lease":
        """elect, then keep the leadership alive: for a with statement, which
        resigns on exit. lease.lost is set, and on_lost called, once if
        leadership is lost: stop acting as the leader then."""
        lease = self.elect(name, value=value, ttl_ms=ttl_ms, wait_ms=wait_ms)
        lease.keep_alive(on_lost=on_lost)
        return lease

    def leader(self, name: str, after_token: Optional[int] = None, wait_ms: int = 0) -> Leader:
        """Who leads the election name. With after_token (the last answer's
        token, or 0) and wait_ms, waits up to wait_ms for a term other than
        after_token: a long poll, to follow every change. It returns at
        the change, or once wait_ms is over with who leads then (the term
        after_token still, or nobody). A wait longer than the server's
        --max-wait (60 s by default) goes in several polls of the longest
        it allows, until the term changes or wait_ms is over, as the Go
        client's Observe does; the client remembers that maximum, as
        acquire does. A poll retried after a 503, a lost answer or a
        proxy's page (up to retries times) waits only what is left of its
        own wait. wait_ms without after_token is an
        InvalidArgumentError: there is nothing to wait past."""
        if _check_wait(wait_ms) and after_token is None:
            raise _invalid("wait_ms", f"wait_ms {wait_ms}: a long poll needs after_token, the term to wait past "
                                      "(0: wait until someone leads)")
        if not wait_ms:
            query = "" if after_token is None else "?" + urllib.parse.urlencode({"after_token": str(after_token)})
            return _leader(self._call("GET", name, query, None, kind="elections"))
        end = time.monotonic() + wait_ms / 1000.0
        while True:
            # At most the server's --max-wait a poll, which a 400 on
            # wait_ms says (max_wait_ms), as _take asks: a longer wait_ms
            # was refused outright (docs/design.md, defect 135).
            left_ms = max(1, math.ceil((end - time.monotonic()) * 1000))
            ask_ms = min(left_ms, self._max_wait_ms or left_ms)
            query = "?" + urllib.parse.urlencode({"after_token": str(after_token), "wait_ms": str(ask_ms)})
            try:
                # resend_lost: a poll whose answer was lost (its connection
                # closed: a fenced gone) is asked again as after a 503, for
                # what is left of its wait; a GET changes nothing.
                doc = self._call("GET", name, query, None, extra_timeout=ask_ms / 1000.0, kind="elections",
                                 wait_end=time.monotonic() + ask_ms / 1000.0, resend_lost=True)
            except InvalidArgumentError as e:
                if e.field == "wait_ms" and e.max_wait_ms and e.max_wait_ms < ask_ms:
                    self._max_wait_ms = min(e.max_wait_ms, self._max_wait_ms or e.max_wait_ms)
                    continue  # at once, in polls the server allows
                raise
            # The server answers at a change, or at the end of the poll's
            # wait: then the next poll, while wait_ms lasts.
            if doc["token"] != after_token or time.monotonic() >= end:
                return _leader(doc)

    def inspect(self, name: str) -> LockState:
        """The lock's state: whether it is held, its token, TTL left, owner
        label, count, last token, and its queue (see LockState); never the
        lease id nor the holder identity."""
        return LockState._from_answer(self._call("GET", name, "", None))

    def list_locks(self, prefix: str = "", limit: Optional[int] = None, cursor: str = "") -> LockPage:
        """One page of the locks held now whose names start with prefix
        ("" for all), in no promised order: at most limit of them (1 to
        MAX_LIST_LIMIT; None: the server's default, 100), from cursor (""
        for the first page, then the previous page's next_cursor). A lock
        held while all the pages are read is listed; one acquired or
        released meanwhile may be missed or listed twice. A limit out of
        range raises InvalidArgumentError (field "limit") without sending,
        as the Go client's List does; a bad prefix or cursor reaches the
        server, which says what it takes. A bearer token limited to name
        prefixes lists under one of them only (ForbiddenError, field
        "prefix"). iter_locks follows the cursors."""
        q: dict[str, str] = {}
        if prefix:
            q["prefix"] = prefix
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
                raise _invalid("limit", f"limit {limit!r}: want 1 to {MAX_LIST_LIMIT} (None: the server's default)")
            q["limit"] = str(limit)
        if cursor:
            q["cursor"] = cursor
        path = "/v1/locks" + ("?" + urllib.parse.urlencode(q) if q else "")
        doc = self._send("GET", path, None)
        return LockPage([LockState._from_answer(st) for st in doc["locks"]], doc.get("next_cursor", ""))

    def iter_locks(self, prefix: str = "", limit: Optional[int] = None) -> Iterator[LockState]:
        """Every lock held whose name starts with prefix, as list_locks
        reads them, page after page (of limit each; None: the server's
        default), following next_cursor until the last page. A page is
        asked for only once the one before has been used up."""
        cursor = ""
        while True:
            page = self.list_locks(prefix, limit, cursor)
            yield from page.locks
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def force_release(self, name: str, token: Optional[int] = None) -> LockState:
        """Delete the lock's lease whoever holds it, and wake the next
        waiter: an operator's act, for a holder known to be gone (DELETE
        /v1/locks/{name}; the bearer token needs the force-release
        permission, else ForbiddenError). Returns the state the lock had:
        its token, owner, ...; held False if nobody held it, as the Go
        client's ForceRelease. The holder learns of it at its next refresh
        or release (LostError); its token still fences its late writes.

        With token (1 to MAX_TOKEN), only the grant with that token is
        released: a lock held by another raises HeldByOtherError (its token
        says whose), and nothing is released. Such a call is sent again
        after a 503, a lost answer or a proxy's page (defect 119), as a
        release is: the next holder has
        another token, so a request sent again releases nobody else. It then
        returns held False or raises HeldByOtherError, as it would if the
        grant had gone before the first request; either way that token no
        longer holds the lock, which is what was asked.

        Without token the request is sent once: after a 503 or an answer
        lost once it was sent, the UnavailableError or TransportError says
        the lock may have been released, since a second request would
        release whatever holds it by then, most often the waiter the first
        one woke. Inspect the lock then: if it is still held, by the holder
        meant, force_release it with the token it shows (a free lock shows
        token 0, which names no grant: InvalidArgumentError)."""
        if token is not None:
            try:
                _check_token(token)
            except ValueError as e:
                raise _invalid("token", f"token: {e}, the token of the grant to release "
                                        "(None: release it whoever holds it)") from None
        try:
            if token is None:
                doc = self._call("DELETE", name, "", None, retries=0)
            else:
                doc = self._call("DELETE", name, f"?token={token}", None, resend_lost=True)
            return LockState._from_answer(doc)
        except NotFoundError as e:
            # Not held: nothing to release (a 404 on the lock, no field).
            if e.field is not None:
                raise
            return LockState(name, False, 0, 0)
        except FencedError as e:
            # A 503, an answer lost once sent, or one not fenced's decision
            # (a proxy's page after fenced acted: defect 119) may each come
            # after the lock was released.
            if not (isinstance(e, (UnavailableError, TransportError)) or _not_decision(e)):
                raise
            if token is not None or isinstance(e.__cause__, ConnectionRefusedError):
                raise
            raise type(e)(f"{e.message}; the request may have reached the server and released the lock, "
                          "so it is not sent again (a second would release the next holder): inspect the "
                          "lock to see whether it is held now and by whom; if by the holder to release, "
                          "force_release it with that token, which is safe to send again",
                          e.status, e.code, e.retry_after) from e

    def refresh_id(self, name: str, lease_id: str, ttl_ms: Optional[int] = None,
                   seq: Optional[int] = None) -> dict[str, Any]:
        """Extend the lease lease_id of name; the raw answer. Lease.refresh is the usual way.
        A refresh whose answer was lost, or was not fenced's decision (a
        proxy's page, a 5xx other than 503: defect 119), is sent again, as
        a release's is: a refresh by the same lease id extends it again,
        from later.

        seq (API field seq; default None: unordered) numbers this refresh
        among the lease's: 1 to 2^53-1, higher with each refresh, the same
        when you send one again (after a TransportError, say), such as
        next_refresh_seq() drawn once per refresh. fenced applies none below
        the highest it applied and raises OutOfOrderError instead (not
        applied; the lease is still held), so a refresh delayed on its way
        cannot shorten the lease a later one extended. The server refuses
        anything else (InvalidArgumentError, field "seq")."""
        body: dict[str, Any] = {"lease_id": lease_id}
        if ttl_ms is not None:
            body["ttl_ms"] = ttl_ms
        if seq is not None:
            body["seq"] = seq
        return self._call("POST", name, "/refresh", body, resend_lost=True)

    def release_id(self, name: str, lease_id: str, release_id: Optional[str] = None) -> None:
        """Release the lease lease_id of name. Lease.release is the usual way.
        A release whose answer was lost, or was not fenced's decision (a
        proxy's page, a 5xx other than 503: defect 119), is sent again, as a
        503 is (up to retries times): the server answers a release by the
        lease id that released it with success, so asking again is safe.

        release_id (API field release_id) is this release's id across its
        retries: 32 lowercase hex digits, such as secrets.token_hex(16); None draws a
        new one for this call, which its own resends carry. A lock held more
        than once by its holder (reentrant) loses one hold per release id, so
        to send a release again yourself (after a TransportError, say), pass
        the same release_id each time, or the retry takes off a second hold.
        The server refuses a malformed one (InvalidArgumentError)."""
        if release_id is None:
            release_id = secrets.token_hex(16)
        self._release(name, lease_id, release_id)

    def _release(self, name: str, lease_id: str, release_id: str, sent: Optional[list[float]] = None) -> None:
        self._call("POST", name, "/release", {"lease_id": lease_id, "release_id": release_id},
                   resend_lost=True, sent=sent)

    def _take(self, name: str, action: str, body: dict[str, Any], wait_ms: int, kind: str) -> "Lease":
        """POST an acquire or campaign body and make its answer a Lease.

        A wait longer than the server's --max-wait (which it says in a 400
        on wait_ms, max_wait_ms) is asked for in requests of that length,
        in one place in the queue; the client remembers the maximum. Only
        the request whose wait is all the call has left is final (gives
        its place up if it ends held); a 409 that comes before wait_ms is
        over, a final request's too, is asked again after a back-off
        (defect 242); if a fair wait ends after a 409 to
        an earlier one (answered late, or the back-off ran to the end), one
        more request, final with wait_ms 1, gives the place up, and its
        grant is returned or its HeldError raised (defect 128). One
        attempt (wait_ms 0) is sent again by _call, up to retries times,
        after a 503, a lost answer or a proxy's page (defect 119). A wait
        rides out every failure without fenced's decision (_unanswered: no
        answer, a 5xx, a page) until it ends, whatever retries says, as the
        Go client does: its next request asks for what is left, with the
        same waiter and the final of its own (defect 130); the failure is
        raised once the wait is over. fenced's refusals end the call. A
        fair wait cut short by an exception that is not fenced's
        (KeyboardInterrupt, SystemExit, ...) gives its place up with one
        more request before it is raised (_give_up; defect 134); one
        attempt and an unfair wait send one attempt with their waiter, and
        each releases the grant it finds."""
        sent: list[float] = []
        # The key to this call's grant if an answer is lost, and one place
        # in the queue for every request of a fair wait (API field waiter).
        # One attempt and an unfair wait have no place, but find their
        # grant all the same.
        body["waiter"] = secrets.token_hex(16)
        try:
            if wait_ms <= 0:
                doc = self._call("POST", name, action, body, kind=kind, sent=sent, resend_lost=True)
                lease = self._granted(doc, sent[-1], name, action)
                if lease is None:
                    raise _no_validity(name)
                return lease
            return self._wait(name, action, body, wait_ms, kind)
        except BaseException as e:
            # Cut short by the caller: an exception that is not fenced's
            # (KeyboardInterrupt, SystemExit, ...) in a request or a
            # back-off. A fair request sent (final is set on each) may
            # have left a place that would stand 3 s before everyone
            # behind it, so it is given up first (docs/design.md, defect
            # 134). Any request cut short, one attempt's and an unfair
            # wait's too, may have been granted, its answer on its way:
            # the give-up finds that grant through the waiter and releases
            # it, where it held the lock, known to nobody, for its TTL
            # ("A lost answer"). So may the last request of a call that
            # ends with no answer of fenced's to it: lost, a proxy's page,
            # or the client's own timeout once it was sent (_maybe_granted;
            # defect 239); the requests before it were sent again, with
            # the waiter, while retries or the wait allowed. Any other
            # FencedError is the call's own end, which the rules of defect
            # 128 handle.
            if not isinstance(e, FencedError) or _maybe_granted(e) and not e._no_lease:
                self._give_up(name, action, body, kind, placed="final" in body)
            raise

    def _wait(self, name: str, action: str, body: dict[str, Any], wait_ms: int, kind: str) -> "Lease":
        """The requests of a waiting _take (wait_ms > 0), as _take says."""
        fair = not body.get("unfair")
        began = time.monotonic()
        end = began + wait_ms / 1000.0
        position = 0  # in the queue, as the last 409 that had one said
        backoff = _MIN_HELD_BACKOFF
        failed = 0  # requests in a row that failed without fenced's decision
        asked_past_wait = False
        while True:
            left_ms = max(1, math.ceil((end - time.monotonic()) * 1000))
            ask_ms = min(left_ms, self._max_wait_ms or left_ms)
            body["wait_ms"] = ask_ms
            # The request whose wait is all the call has left gives its
            # place up if it ends held, rather than keep a free lock from
            # those behind it; an earlier one keeps it for the next.
            last = ask_ms >= left_ms
            if fair:
                body["final"] = last
            sent = []
            try:
                # retries=0: this loop sends it again, within the wait.
                doc = self._call("POST", name, action, body, extra_timeout=ask_ms / 1000.0, kind=kind,
                                 retries=0, resend_lost=True, sent=sent)
            except InvalidArgumentError as e:
                if e.field == "wait_ms" and e.max_wait_ms and e.max_wait_ms < ask_ms:
                    self._max_wait_ms = min(e.max_wait_ms, self._max_wait_ms or e.max_wait_ms)
                    continue  # at once, in requests the server allows
                raise
            except HeldError as e:
                failed = 0
                if e.position:
                    position = e.position
                now = time.monotonic()
                # The wait ends when wait_ms is over, not at the last
                # request's 409: one answered with time left (a proxy that
                # answers for fenced, a fenced restarting, a server whose
                # wait is shorter than asked) is asked again below, with
                # the same waiter, for what is left, as the Go client does
                # (docs/design.md, defect 242); so is a grant that came back
                # with no validity left (503 on ttl_ms: nobody holds the
                # lock), whose later grant may be quicker (defect 182).
                if now >= end and (last or not fair):
                    raise _wait_over(e, name, kind, wait_ms, began, position)  # no request once the wait is over
                # A fair wait may end after a request that was not final:
                # its 409 came late (a slow network, a loaded machine), or
                # the back-off below ran to the end. That request's place
                # is kept 3 s for a next one, holding a free lock from
                # every later waiter; so the wait ends with one more
                # request, final and of 1 ms (left_ms once the wait is
                # over), which gives the place up (docs/design.md, defect
                # 128). An unfair wait has no place.
                if now >= end:
                    continue
                if now - sent[-1] >= ask_ms / 2000.0:
                    # Held at the end of the wait asked for: the next
                    # request at once, but no sooner than 50 ms after this
                    # one began. Requests of a millisecond (a server's
                    # --max-wait 1ms) made a waiter send hundreds a second
                    # (docs/design.md, defect 143).
                    backoff = _MIN_HELD_BACKOFF
                    pause = _MIN_HELD_BACKOFF - (now - sent[-1])
                    if pause <= 0:
                        continue
                else:
                    # Held well before the wait asked for (a server's
                    # shorter limit, a proxy's timeout): back off rather
                    # than poll it in a busy loop, as the Go client does.
                    pause = backoff
                    backoff = min(2 * backoff, _MAX_HELD_BACKOFF)
                time.sleep(min(pause, end - now))
                if time.monotonic() >= end and (last or not fair):
                    # It ended in the back-off (a final request's place is gone already).
                    raise _wait_over(e, name, kind, wait_ms, began, position)
                continue  # a fair one's wait may be over: then the request giving its place up
            except FencedError as e:
                if not _unanswered(e):
                    raise  # fenced's refusal (401, 403, 404, ...): the call ends
                # No decision (a restart, a refused connection, a lost
                # answer, a 503, a proxy's page): ride it out until the
                # wait ends, as the Go client does, rather than give up
                # after retries with most of the wait left; each request
                # asks for what is left, with the same waiter, so a grant
                # whose answer was lost is found (docs/design.md, defect
                # 130).
                failed += 1
                pause = _retry_pause(e, failed)
                if time.monotonic() + pause >= end:
                    # The wait is over (or will be after the pause): no
                    # request to wait once it is over. But a lost answer,
                    # a proxy's page, or a timeout once the request was
                    # sent (defect 239), may be a grant made for this
                    # waiter, which only another request with the waiter
                    # finds again: ask once more, now, waiting what is
                    # left or 1 ms (still a waiting request, final),
                    # rather than leave that lease to hold the lock until
                    # its TTL. A 503 is not asked again.
                    if asked_past_wait or not _maybe_granted(e):
                        raise
                    asked_past_wait = True
                    continue
                time.sleep(pause)
                continue
            # The validity runs from the request that answered: a grant
            # found again is extended to ttl_ms by that request.
            lease = self._granted(doc, sent[-1], name, action)
            if lease is not None:
                return lease
            if time.monotonic() >= end:
                raise _no_validity(name)
            # Released: wait on for the time left, as the Go client does.

    def _give_up(self, name: str, action: str, body: dict[str, Any], kind: str, placed: bool) -> None:
        """End a call its caller cut short, as the Go client's giveUp: one
        request with the call's waiter, within about 1 s of its own. For a
        fair wait (placed), final and of 1 ms: the server gives the place
        up as soon as the request cut short ends there too (its connection
        was closed: _request). For one attempt or an unfair wait, which
        have no place, one attempt (wait_ms 0). Its answer may be a grant (the lock came
        free, or the request cut short was granted and its waiter finds
        that grant again): not the caller's, so it is released at once,
        best effort, where it would otherwise hold the lock, known to
        nobody, until its TTL. Every error is ignored: the caller gets the
        exception that cut the wait short. A second one (another Ctrl-C)
        ends the give-up too (docs/design.md, defect 134)."""
        end = time.monotonic() + 1.0
        try:
            if placed:
                again = dict(body, wait_ms=1, final=True)
            else:  # neither unfair nor final applies to one attempt
                again = {k: v for k, v in body.items() if k not in ("unfair", "final")}
                again["wait_ms"] = 0
            doc = self._call("POST", name, action, again, kind=kind,
                             timeout=min(1.0, self.timeout), retries=0)
            if doc.get("lease_id"):
                # What is left of the second, but time for one request.
                self._call("POST", name, "/release", {"lease_id": doc["lease_id"],
                                                      "release_id": secrets.token_hex(16)},
                           timeout=max(end - time.monotonic(), 0.1), retries=0)
        except Exception as e:  # best effort: the place goes in 3 s anyway, and a grant at its TTL
            _log.debug("fenced: giving up the place of a wait for %r cut short failed: %s", name, e)

    def _granted(self, doc: dict[str, Any], started: float, name: str, action: str) -> Optional["Lease"]:
        """The Lease of the grant doc, the answer of the acquire or campaign
        (action) of name sent at started: the one place an answer becomes
        a Lease. An answer that lacks lease_id, token or ttl_ms (a 200 with
        {} from a wrong base URL or a proxy) is a FencedError that says so,
        as the Go client's adopt: no KeyError, nor a Lease missing fields.
        None if it came with no validity left (answered slower
        than its TTL: a slow proxy, a pause of this process). The server
        may have freed such a lock already, or will any moment: a caller
        acting on it could overlap the next holder, and one that did not
        would leave it held until its TTL. So it is released at once,
        best effort (bounded to about 1 s; errors ignored: it expires
        anyway), and not acquired, as the Go client does (docs/design.md,
        defect 117). A reentrant holder's grant added one hold, which this
        release takes off."""
        if not (isinstance(doc.get("lease_id"), str) and doc["lease_id"]
                and _positive_int(doc.get("token")) and _positive_int(doc.get("ttl_ms"))):
            err = FencedError(f"{action.strip('/')} {name!r}: the server's answer lacks lease_id, token or ttl_ms", 200)
            err._no_lease = True  # answered, with no grant: nothing to give up (Client._take)
            raise err
        if not isinstance(doc.get("name"), str):
            doc = dict(doc, name=name)  # the lock asked for: the answer's name is that one
        lease = Lease(self, doc, started)
        if time.monotonic() < lease.deadline:
            return lease
        try:
            body = {"lease_id": lease.lease_id, "release_id": secrets.token_hex(16)}
            self._call("POST", lease.name, "/release", body, timeout=min(1.0, self.timeout), retries=0)
        except Exception as e:  # best effort: it expires anyway
            _log.debug("fenced: release of %r granted with no validity left failed: %s", lease.name, e)
        return None

    # -- HTTP --------------------------------------------------------------

    def _call(self, method: str, name: str, action: str, body: Optional[dict[str, Any]],
              extra_timeout: float = 0.0, timeout: Optional[float] = None,
              retries: Optional[int] = None, kind: str = "locks",
              resend_lost: bool = False, sent: Optional[list[float]] = None,
              wait_end: Optional[float] = None) -> dict[str, Any]:
        """One API call, retried after a 503 up to retries times; with
        resend_lost (a body with a waiter, a refresh, a release or a
        force-release with a token: requests the server answers the same
        when asked again) also after an answer lost once the request was
        sent, or one that is not fenced's decision (_not_decision: a
        proxy's page, a 5xx other than 503, a body that is not JSON)
        (docs/design.md, defect 119). Each after a pause (_retry_pause: the
        answer's Retry-After, whatever its status, else 100 ms more each
        time). Without
        resend_lost such a request is never sent again (a force-release
        without a token, sent twice, releases the next holder). After the
        last retry the error is raised. sent, if given, gets the
        time.monotonic() before each request. wait_end, for a request that waits (wait_ms in
        its body, or in its query for a long poll), is the time.monotonic()
        its wait ends at: a request sent again asks for the wait_ms left
        (not the whole again), and none is sent after it. A waiting acquire
        or campaign sends its requests again itself (Client._take)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"lock name {name!r}: want a non-empty string")
        if name in (".", ".."):
            # Dot segments: URL handling (fetch, so the TypeScript client;
            # many proxies) removes them from a path (RFC 3986, 5.2.4),
            # also percent-encoded, and the request reaches another route.
            # http.client sends them as they are, but fenced refuses them as
            # lock names; this client says so itself, without sending.
            raise InvalidArgumentError(f"lock name {name!r}: \".\" and \"..\" are not lock names "
                                       "(a URL path cannot carry them)")
        # Quote everything but the characters lock names may have: a bad
        # name reaches the server, which says what is allowed.
        path = f"/v1/{kind}/" + urllib.parse.quote(name, safe="") + action
        return self._send(method, path, body, extra_timeout=extra_timeout, timeout=timeout, retries=retries,
                          resend_lost=resend_lost, sent=sent, wait_end=wait_end)

    def _send(self, method: str, path: str, body: Optional[dict[str, Any]],
              extra_timeout: float = 0.0, timeout: Optional[float] = None,
              retries: Optional[int] = None, resend_lost: bool = False,
              sent: Optional[list[float]] = None, wait_end: Optional[float] = None) -> dict[str, Any]:
        """_call's request to path (with its query), which names no lock
        (the list) or one _call checked."""
        attempt = 0
        retries = self.retries if retries is None else retries
        while True:
            if sent is not None:
                sent.append(time.monotonic())
            try:
                return self._request(method, path, body, (timeout or self.timeout) + extra_timeout, sent)
            except FencedError as e:
                # A 503 is sent again; a request safe to send again also
                # after an answer lost once it was sent, or one that is not
                # fenced's decision (a proxy's 502 or 504 page, a 500, a
                # body that is not JSON): either may come after fenced
                # applied it, a grant for this waiter say, which only the
                # same request finds again (docs/design.md, defect 119).
                # An acquisition (its waiter finds its grant) also after a
                # timeout once sent: a lost answer all the same (defect 239).
                acquisition = "waiter" in (body or {})
                if not (isinstance(e, UnavailableError) or resend_lost and (
                        _maybe_granted(e) if acquisition else _lost_or_not_decision(e))):
                    raise
                if attempt >= retries:
                    raise
                attempt += 1
                pause = _retry_pause(e, attempt)
                if wait_end is not None:
                    left_ms = int((wait_end - time.monotonic() - pause) * 1000)
                    if left_ms < 1:
                        raise  # the wait is over (or will be after the pause): no request to wait
                    if body is not None:
                        body["wait_ms"] = left_ms
                    else:
                        path = _with_wait(path, left_ms)
                    extra_timeout = left_ms / 1000.0
                time.sleep(pause)

    def close(self) -> None:
        """Close every connection the client keeps, every thread's: an idle
        one at once, one that a call in another thread is using as that
        call returns. The client stays usable: the next call opens another;
        so it ends no call in progress (a waiting acquire in another thread
        waits on, its next request on a new connection)."""
        with self._conns_mu:
            self._reap()
            self._gen += 1
            idle = [c for c in self._conns if c not in self._busy]
            self._conns.difference_update(idle)
        for c in idle:
            c.close()

    def _reap(self) -> None:
        """Take the connections of ended threads that _close_ended could
        not take out of _conns out of it. Under _conns_mu."""
        while self._dead:
            c = self._dead.pop()
            self._conns.discard(c)
            self._busy.discard(c)

    def _slot(self) -> "_ConnSlot":
        """The calling thread's slot for its connection; at its first call,
        a new one, held by a new _ConnHolder in the thread's local dict,
        whose finalizer closes the slot's connection when the holder goes:
        when the thread ends (or the client does). The finalizer holds the
        slot and the client's sets, not the holder nor the client."""
        holder = getattr(self._local, "holder", None)
        if holder is None:
            holder = _ConnHolder()
            weakref.finalize(holder, _close_ended, self._conns_mu, self._conns, self._busy, self._dead, holder.slot)
            self._local.holder = holder
        return holder.slot

    def _thread_conn(self) -> Optional[http.client.HTTPConnection]:
        """The calling thread's connection, if it has one (for the tests)."""
        holder = getattr(self._local, "holder", None)
        return holder.slot.conn if holder is not None else None

    def _drop(self) -> None:
        """Close the calling thread's connection (the server closed it, or
        it failed), if it has one; its next call opens another."""
        holder = getattr(self._local, "holder", None)
        if holder is None:
            return
        conn, holder.slot.conn = holder.slot.conn, None
        if conn is not None:
            with self._conns_mu:
                self._conns.discard(conn)
            conn.close()

    def _done(self, conn: http.client.HTTPConnection) -> None:
        """A call is done with conn: closed if close() came meanwhile."""
        with self._conns_mu:
            self._busy.discard(conn)
            stale = getattr(conn, "_fenced_gen", self._gen) != self._gen
            if stale:
                self._conns.discard(conn)
        if stale:
            conn.close()

    def _conn(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it was used before. A kept
        connection that the server closed while idle is replaced."""
        # Under the lock, so that close() in another thread cannot close
        # it between this look and the call marking it busy.
        slot = self._slot()
        with self._conns_mu:
            self._reap()
            conn = slot.conn
            if conn is not None and (conn.sock is None or getattr(conn, "_fenced_gen", -1) != self._gen):
                self._conns.discard(conn)  # closed, by close() or a failure
                conn.close()
                conn = None
            if conn is not None:
                try:
                    readable, _, _ = select.select([conn.sock], [], [], 0)
                except (OSError, ValueError):
                    readable = [conn.sock]
                if readable:  # idle, so readable means closed (or a stray byte): do not reuse
                    self._conns.discard(conn)
                    conn.close()
                    conn = None
            reused = conn is not None
            if conn is None:
                if self._url.scheme == "https":
                    conn = _HTTPSConnection(self._url.hostname or "", self._url.port, timeout=timeout,
                                            context=self._ssl_context)
                else:
                    conn = _HTTPConnection(self._url.hostname or "", self._url.port, timeout=timeout)
                conn._fenced_gen = self._gen  # type: ignore[attr-defined]
                slot.conn = conn
                self._conns.add(conn)
            else:
                conn.timeout = timeout
                conn.sock.settimeout(timeout)
            self._busy.add(conn)
            return conn, reused

    def _request(self, method: str, path: str, body: Optional[dict[str, Any]], timeout: float,
                 sent: Optional[list[float]] = None) -> dict[str, Any]:
        """One request, sent again once on a fresh connection when a kept
        one was closed as it went out, unless it waits (wait_ms in its body
        or query); sent, if given, gets the time.monotonic() before that
        second one. timeout bounds the whole of it: connecting and the TLS
        handshake (_HTTPConnection), sending and reading all of the answer
        (_bounded_answer), not each read of the socket: an answer that
        trickles in a byte at a time kept a refresh of the keep-alive going
        some 40 s past the lease's validity (docs/design.md, defect 238). A
        timeout once the request was sent is a TransportError that
        _timed_out_sent says may have been acted on. An OSError that is not the standard library's (a caller's own,
        raised by a signal handler) is raised as it is, not as a
        TransportError."""
        data = None
        headers = {"Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._bearer:
            headers["Authorization"] = "Bearer " + self._bearer
        # A new lease's request is sent twice only with a waiter (the client
        # sends one with every acquire): the server hands a lease it granted
        # back to the same waiter. Without, a lease granted to a request
        # whose answer was lost would be held by nobody until its TTL.
        # Nor is a force-release without a token: sent twice, it releases
        # the next holder too.
        # Nor is a request that waits (an acquire or campaign with wait_ms,
        # a leader long poll): the closed connection may have carried it
        # for most of its wait, and sent again here, the same bytes, it
        # would wait all of it again. Its call sends it again, for what is
        # left of the wait (Client._wait, Client.leader).
        waits = bool((body or {}).get("wait_ms")) or "wait_ms=" in path.partition("?")[2]
        resend = ((not path.endswith(("/acquire", "/campaign")) or "waiter" in (body or {}))
                  and not (method == "DELETE" and "?token=" not in path) and not waits)
        deadline = time.monotonic() + timeout
        for attempt in (0, 1):
            conn, reused = self._conn(max(deadline - time.monotonic(), 0.001))
            conn.deadline = deadline  # type: ignore[attr-defined]
            written = False
            try:
                conn.response_class = _bounded_answer(deadline, timeout)  # type: ignore[assignment]
                conn.request(method, self._url.path.rstrip("/") + path, body=data, headers=headers)
                written = True
                resp = conn.getresponse()
                raw = resp.read()
                status, rheaders = resp.status, resp.headers
                if resp.will_close:
                    self._drop()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError) as e:
                refusal = None if reused else _refusal(conn, e, deadline)
                self._drop()
                if refusal is not None:
                    raise _refused(method, self.base_url, path, refusal) from refusal
                # The server closed a kept connection as the request went out.
                if reused and attempt == 0 and resend:
                    if sent is not None:
                        sent.append(time.monotonic())
                    continue
                raise TransportError(f"{method} {self.base_url}{path}: {e}") from e
            except ssl.SSLCertVerificationError as e:
                # No transient failure: every handshake fails the same way
                # until the client is told to trust the certificate.
                self._drop()
                raise _untrusted(method, self.base_url, path, e) from e
            except (OSError, http.client.HTTPException) as e:
                # The server refused the client's certificate (mutual TLS):
                # as a certificate not trusted, no transient failure.
                refusal = _refusal(conn, e, deadline) if not reused or _alert(e) else None
                self._drop()
                if refusal is not None:
                    raise _refused(method, self.base_url, path, refusal) from refusal
                if isinstance(e, OSError) and type(e).__module__ not in _TRANSPORT_MODULES:
                    # Not the request's failure but the caller's own (a
                    # TimeoutError of its own, raised by a signal handler
                    # during a wait): raised as it is, as any other
                    # exception that is not fenced's (below), so it ends a
                    # wait rather than be ridden out as no answer.
                    raise
                err = TransportError(f"{method} {self.base_url}{path}: {e}")
                err._timed_out_sent = written and isinstance(e, socket.timeout)
                raise err from e
            except BaseException:
                # Cut short by the caller (KeyboardInterrupt, ...): the
                # connection may have a request out whose answer is unread,
                # and the next call on it would fail. Closed, it also tells
                # fenced to end that request (a wait's would wait on, its
                # place with it: docs/design.md, defect 134).
                self._drop()
                raise
            finally:
                self._done(conn)
        if 300 <= status < 400:
            raise _redirected(method, self.base_url, path, status, rheaders.get("Location") or "")
        if status >= 400:
            raise _api_error(status, rheaders, raw)
        if status != 200:
            # fenced's only success is 200 (the API's, and the Go client's,
            # reading): a 202 {} or a 204 is something in front of it
            # answering in its place, maybe without passing the request on.
            # Taken as fenced's answer, a release "succeeded" while fenced
            # held the lock until its TTL (docs/design.md, defect 237). It
            # is no decision of fenced's (_not_decision): sent again where
            # that is safe, like a proxy's page.
            said = f": {raw[:80]!r}" if raw else ""
            raise FencedError(f"{method} {self.base_url}{path}: HTTP {status}, not fenced's answer (fenced answers "
                              f"200 or an API error){said}", status)
        try:
            doc = json.loads(raw)
        except ValueError:
            raise FencedError(f"{method} {path}: answer is not JSON: {raw[:80]!r}", status) from None
        if not isinstance(doc, dict):
            raise FencedError(f"{method} {path}: answer is not a JSON object: {raw[:80]!r}", status)
        return doc


# The pauses between the requests of a wait after a 409 that came well
# before the wait asked for (seconds): doubled each time, as the Go client's.
# After one at the end of it, the next request goes no sooner than
# _MIN_HELD_BACKOFF after that one began (defect 143).
_MIN_HELD_BACKOFF, _MAX_HELD_BACKOFF = 0.05, 1.0

# The keep-alive's least pause after a failed refresh is min(ttl/10, this),
# in seconds, as the Go client's keep-alive (lock.Lease's step).
_MAX_KEEP_ALIVE_PAUSE = 1.0

# The modules whose OSErrors a request's own failure raises (a refused or
# reset connection, a timeout, a name not resolved, TLS): a TransportError.
# Any other OSError is the caller's and is raised as it is (Client._request).
_TRANSPORT_MODULES = frozenset({"builtins", "socket", "ssl", "http.client"})

# The connection closed or was reset while the request went out or its
# answer was awaited: the server may have acted on it.
_LOST_ANSWER = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
                http.client.RemoteDisconnected, http.client.IncompleteRead)


def _positive_int(v: Any) -> bool:
    """Whether v is a JSON integer above 0 (not a bool, which is an int in Python)."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _bounded_answer(deadline: float, timeout: float) -> Callable[..., http.client.HTTPResponse]:
    """An HTTPConnection.response_class for one request: its answer is read
    within what is left of the request's timeout, as a whole; each read of
    the socket waits only for what is left until deadline, and none starts
    after it. http.client's socket timeout bounds each read alone, so an
    answer trickling in a byte at a time (a proxy, a congested link) took
    many times the timeout (docs/design.md, defect 238)."""
    return lambda sock, *args, **kwargs: http.client.HTTPResponse(
        _BoundedSocket(sock, deadline, timeout), *args, **kwargs)  # type: ignore[arg-type]


class _HTTPConnection(http.client.HTTPConnection):
    """An HTTPConnection whose connect, and what follows it, end by the
    request's deadline (time.monotonic(); set by Client._request before
    each request)."""

    deadline: Optional[float] = None  # None: the timeout given, for each step

    def connect(self) -> None:
        if self.deadline is not None:
            self.timeout = max(self.deadline - time.monotonic(), 0.001)
            # Each address of the host name gets what is left, not the
            # timeout again: socket.create_connection gave each the whole,
            # so two that do not answer took twice the request's timeout.
            self._create_connection = functools.partial(_connect_by, self.deadline)
        super().connect()
        # What follows has only what is left: the TLS handshake of an
        # _HTTPSConnection, whose connect calls this one first, takes the
        # socket's timeout as its bound as a whole from when it begins, so
        # it had the request's whole timeout again once the TCP connect
        # was done (docs/design.md, defect 244); and sending the request.
        if self.deadline is not None:
            self.sock.settimeout(max(self.deadline - time.monotonic(), 0.001))


def _connect_by(deadline: float, address: tuple[str, int], timeout: Optional[float] = None,
                source_address: Optional[tuple[str, int]] = None) -> socket.socket:
    """socket.create_connection, the host name looked up (_resolve) and
    each of its addresses tried with what is left until deadline
    (time.monotonic()), none after it; timeout (the same deadline, as it
    was when connect began) is not used."""
    host, port = address
    err: Optional[OSError] = None
    for af, socktype, proto, _, sa in _resolve(host, port, deadline):
        left = deadline - time.monotonic()
        if left <= 0 and err is not None:
            break
        sock = None
        try:
            sock = socket.socket(af, socktype, proto)
            sock.settimeout(max(left, 0.001))
            if source_address:
                sock.bind(source_address)
            sock.connect(sa)
            return sock
        except OSError as e:
            if sock is not None:
                sock.close()
            err = e
    if err is not None:
        raise err
    raise OSError(f"getaddrinfo returned no address for {host!r}")


def _resolve(host: str, port: int, deadline: float) -> list[Any]:
    """socket.getaddrinfo(host, port, 0, SOCK_STREAM), waited for until
    deadline (time.monotonic()) and no longer: a socket.timeout that says
    the name did not resolve in time, the lookup left to end in its own
    thread. getaddrinfo cannot be interrupted, and the system resolver
    waits its own timeouts for DNS servers that do not answer (5 s a
    server, per attempt, by default), so a request with timeout=2 took
    10 s or more; a deadline passed during the lookup did not end it
    either (docs/design.md, defect 253). An IP address is no lookup: asked
    here, at once. Every request for one name and port waits on the same
    lookup while it is in flight (_Lookup), so a DNS server that does not
    answer costs one thread, not one per request sent again."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    with _Lookup.mu:
        lookup = _Lookup.in_flight.get((host, port))
        if lookup is None:
            lookup = _Lookup.in_flight[(host, port)] = _Lookup(host, port)
    left = deadline - time.monotonic()
    if not lookup.done.wait(max(left, 0.0)):
        waited = time.monotonic() - lookup.began
        raise socket.timeout(
            f"the host name {host!r} did not resolve within the request's timeout (no answer from the system "
            f"resolver {waited:.1f} s after the lookup began): check that the DNS servers this host uses "
            f"(/etc/resolv.conf) answer for it, or give the base URL an IP address")
    if lookup.error is not None:
        # A copy: the same exception raised in several threads would
        # gather each one's traceback.
        raise copy.copy(lookup.error)
    return lookup.addresses


class _Lookup:
    """One socket.getaddrinfo of a host name and port, in a daemon thread
    of its own, that every request for them waits on while it runs
    (_resolve); it leaves in_flight as it ends, so the next request looks
    the name up again (the resolver, not the client, caches)."""

    mu = threading.Lock()
    in_flight: dict[tuple[str, int], "_Lookup"] = {}

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.began = time.monotonic()
        self.done = threading.Event()
        self.addresses: list[Any] = []
        self.error: Optional[BaseException] = None
        threading.Thread(target=self._run, name=f"fenced lookup {host}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.addresses = socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)
        except BaseException as e:  # raised in the requests that wait (gaierror, UnicodeError, ...)
            self.error = e
        finally:
            with _Lookup.mu:
                if _Lookup.in_flight.get((self.host, self.port)) is self:
                    del _Lookup.in_flight[(self.host, self.port)]
            self.done.set()

    @classmethod
    def _forget(cls) -> None:
        """In the child of a fork: no lookup's thread came along, so none
        is in flight (a request would wait on it until its deadline, each
        one, for ever), and mu may have been held by a thread that did
        not come along either."""
        cls.mu = threading.Lock()
        cls.in_flight = {}


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_Lookup._forget)


class _HTTPSConnection(http.client.HTTPSConnection, _HTTPConnection):
    """An HTTPSConnection whose TCP connect and TLS handshake end by the
    request's deadline as a whole: its connect calls _HTTPConnection's
    (next in the method order) for the TCP connect, then shakes hands in
    what is left."""


class _BoundedSocket:
    """What an HTTPResponse takes its file from (makefile): a socket's
    reads, each bounded by what is left until deadline (_BoundedReader)."""

    def __init__(self, sock: socket.socket, deadline: float, timeout: float):
        self._sock, self._deadline, self._timeout = sock, deadline, timeout

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_BoundedReader(self._sock, self._deadline, self._timeout))


class _BoundedReader(io.RawIOBase):
    """The raw reads of _BoundedSocket: through the socket's own unbuffered
    file, which keeps the socket open while the answer is read (http.client
    closes its connection before the body is read when the answer says
    Connection: close), with the socket's timeout set to what is left
    before each."""

    def __init__(self, sock: socket.socket, deadline: float, timeout: float):
        super().__init__()
        self._sock, self._deadline, self._timeout = sock, deadline, timeout
        self._raw = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> Optional[int]:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"timed out: no whole answer within {self._timeout:g} s")
        self._sock.settimeout(left)
        return self._raw.readinto(b)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _ConnSlot:
    """A thread's connection to the server (None while it has none),
    shared by the thread's _ConnHolder and that holder's finalizer."""

    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: Optional[http.client.HTTPConnection] = None


class _ConnHolder:
    """What a thread's threading.local holds of its connection, and
    nothing else holds: it goes when the thread ends, and its finalizer
    (_close_ended) closes the connection then."""

    __slots__ = ("slot", "__weakref__")

    def __init__(self) -> None:
        self.slot = _ConnSlot()


def _close_ended(mu: threading.Lock, conns: set[http.client.HTTPConnection],
                 busy: set[http.client.HTTPConnection], dead: list[http.client.HTTPConnection],
                 slot: _ConnSlot) -> None:
    """The finalizer of a _ConnHolder: its thread ended (or its client
    went), so close the connection in slot and take it out of the client's
    sets, under the client's lock mu. It may run wherever a collection of
    the holder runs, even in a thread that holds mu itself (a holder kept
    by a cycle, then collected there), so it never waits for mu: if mu is
    taken, the connection goes to dead, which the next holder of mu reaps
    (Client._reap). The socket is closed at once either way."""
    conn, slot.conn = slot.conn, None
    if conn is None:
        return
    conn.close()
    if mu.acquire(blocking=False):
        try:
            conns.discard(conn)
            busy.discard(conn)
        finally:
            mu.release()
    else:
        dead.append(conn)


def _no_validity(name: str) -> TTLTooShortError:
    """Not acquired: the grant came with no validity left, and was released
    (Client._granted): raised as a lock still held is, so try_acquire
    returns None (docs/design.md, defect 117)."""
    return TTLTooShortError(f"{name!r}: granted with no validity left (answered after its TTL ran out): "
                            "released, not acquired", 0)


def _leader(doc: dict[str, Any]) -> Leader:
    """The Leader of an answer of GET /v1/elections/{name}."""
    return Leader(doc["name"], doc["leading"], doc.get("value", ""), doc["token"])


def _with_wait(path: str, wait_ms: int) -> str:
    """path with its query's wait_ms set to wait_ms."""
    u = urllib.parse.urlsplit(path)
    q = dict(urllib.parse.parse_qsl(u.query))
    q["wait_ms"] = str(wait_ms)
    return urllib.parse.urlunsplit(u._replace(query=urllib.parse.urlencode(q)))


def _untrusted(method: str, base_url: str, path: str, e: ssl.SSLCertVerificationError) -> CertificateError:
    """The CertificateError of a handshake that failed on the server's
    certificate, e: OpenSSL's reason, and what an operator does about it."""
    why = e.verify_message or e.reason or str(e)
    return CertificateError(
        f"{method} {base_url}{path}: the server's TLS certificate is not trusted ({why}): give the client the CA "
        f"that signed it, Client(..., ssl_context=ssl.create_default_context(cafile=\"ca.pem\")), and check that "
        f"the certificate names the host of {base_url}; not retried")


# The OpenSSL reasons of the TLS alerts (RFC 8446, 6.2) by which a server
# refuses the client's certificate, received from it (OpenSSL names an alert
# it sent otherwise), and what to do about each: read by the reason's name,
# never by the message's text. A TLS 1.2 server that requires a certificate
# answers handshake_failure when it got none (TLS 1.3 has
# certificate_required); the alert can also mean no cipher suite or
# version in common, as permanent, so its advice is hedged.
_NO_CLIENT_CERTIFICATE = ("give the client a certificate signed by a CA the server trusts (its --tls-client-ca), with "
                          "its key: ctx.load_cert_chain(\"client.pem\", \"client.key\") on the Client's ssl_context")
_CLIENT_CERTIFICATE_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        "the server requires a client certificate (mutual TLS) and got none: " + _NO_CLIENT_CERTIFICATE,
    "SSLV3_ALERT_HANDSHAKE_FAILURE":
        "if the server requires a client certificate (mutual TLS), as a TLS 1.2 server says when it got none, "
        + _NO_CLIENT_CERTIFICATE + " (the alert can also mean no TLS version or cipher suite in common)",
    "TLSV1_ALERT_UNKNOWN_CA":
        "the server does not trust the CA that signed the client's certificate: give the client a certificate "
        "signed by a CA the server trusts (its --tls-client-ca), with its key (ssl_context's load_cert_chain)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED":
        "the client's certificate has expired or is not valid yet: give the client a certificate valid now "
        "(ssl_context's load_cert_chain)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "",
}


def _alert(e: BaseException) -> bool:
    """Whether e is an ssl.SSLError for a TLS alert by which the server
    refused the client's certificate (_CLIENT_CERTIFICATE_ALERTS)."""
    return isinstance(e, ssl.SSLError) and getattr(e, "reason", None) in _CLIENT_CERTIFICATE_ALERTS


def _refusal(conn: http.client.HTTPConnection, e: BaseException, deadline: float) -> Optional[ssl.SSLError]:
    """The server's TLS alert refusing the client's certificate that e, the
    failure of a request on conn, a connection made for it, was, or None.
    Under TLS 1.3 the alert comes after the client's side of the handshake,
    so the request is written and its read raises it; but the write can
    fail first on the server's close (an SSLEOFError or a broken pipe: 1 in
    20 on loopback, more often with a body), the alert unread: read then,
    it is there."""
    if _alert(e):
        return e  # type: ignore[return-value]
    sock = conn.sock
    if not isinstance(sock, ssl.SSLSocket) or not isinstance(
            e, (ssl.SSLEOFError, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
        return None
    try:
        sock.settimeout(max(min(deadline - time.monotonic(), 1.0), 0.001))  # a closed connection answers at once
        sock.recv(1)
    except ssl.SSLError as alert:
        if _alert(alert):
            return alert
    except (OSError, ValueError):
        pass
    return None


def _refused(method: str, base_url: str, path: str, e: ssl.SSLError) -> ClientCertificateError:
    """The ClientCertificateError of a handshake the server refused over the
    client's certificate with the alert of e, and what to do about it."""
    reason = str(getattr(e, "reason", "") or "")
    do = _CLIENT_CERTIFICATE_ALERTS.get(reason) or (
        "give the client a certificate the server accepts (ssl_context's load_cert_chain): signed by a CA the "
        "server trusts (its --tls-client-ca), valid now, issued for client authentication (extendedKeyUsage "
        "clientAuth)")
    return ClientCertificateError(
        f"{method} {base_url}{path}: the server refused the client's TLS certificate "
        f"({reason.lower().replace('_', ' ')}): {do}; not retried")


def _lost_answer(e: TransportError) -> bool:
    """Whether e is a request sent (or being sent) whose answer never came:
    not a refused connection, a timeout, or a bad answer."""
    return isinstance(e.__cause__, _LOST_ANSWER)


def _lost_or_not_decision(e: FencedError) -> bool:
    """Whether e is an answer lost once the request was sent (_lost_answer)
    or one that is not fenced's decision (_not_decision): fenced may have
    acted on the request, a grant for its waiter say, which only the same
    request sent again finds (docs/design.md, defect 119)."""
    return isinstance(e, TransportError) and _lost_answer(e) or _not_decision(e)


def _timed_out_sent(e: BaseException) -> bool:
    """Whether e is a request that went out whole and whose answer did not
    all come within its timeout: fenced may have acted on it, its answer
    on the way (a proxy holding it, a link gone slow)."""
    return isinstance(e, TransportError) and e._timed_out_sent


def _maybe_granted(e: BaseException) -> bool:
    """Whether an acquire or campaign that failed with e may have been
    granted, for its waiter to find: its answer lost (_lost_answer), not
    fenced's decision (_not_decision), or timed out once sent
    (_timed_out_sent). Such a request, sent again with its waiter, gets
    that grant; once none is sent again, the call gives up under the
    waiter (Client._give_up) and releases what it gets (docs/design.md,
    defects 226 and 239)."""
    return _lost_or_not_decision(e) or _timed_out_sent(e)


def _unanswered(e: BaseException) -> bool:
    """Whether e is a failure without fenced's decision, which a waiting
    acquire or campaign rides out within its wait (Client._take), as the Go
    client's unanswered: no answer (TransportError: a refused connection, a
    reset, a lost answer, a timeout), any 5xx (503 too), or an answer
    without an API error code (a proxy's page, a body that is not JSON).
    Not fenced's refusals (a 4xx with its code: held, invalid_argument,
    forbidden, ...) nor the client's own (status 0 with a code)
    (docs/design.md, defect 130)."""
    if isinstance(e, TransportError):
        return True
    return isinstance(e, FencedError) and e.status != 0 and (e.status >= 500 or e.code is None)


def _retry_pause(e: FencedError, attempt: int) -> float:
    """Seconds to pause before a request is sent again after its attempt-th
    failure in a row, e: the Retry-After of e's answer, whatever its status
    (fenced's 503, a proxy's 502 or 504 page), else 100 ms a failure; at
    most 1 s, and from half of that to all of it, so that the clients one
    failure hit do not come back at once. As the TypeScript client
    (docs/design.md, defect 131): a 503's Retry-After alone was honoured."""
    # retry_after is None or a whole number of seconds above 0 (_retry_after):
    # a "Retry-After: 0" backs off as none does, never in a busy loop.
    pause = e.retry_after if e.retry_after is not None and e.retry_after > 0 else 0.1 * attempt
    return min(pause, 1.0) * (0.5 + random.random() / 2)


def _retry_after(value: Optional[str]) -> Optional[float]:
    """The seconds a Retry-After header value asks for, or None: only a
    whole number of seconds above 0 counts, as in the Go client's send.
    "0" (a load balancer's 503 page whose upstreams are away for a
    moment), a negative number, a fraction, an HTTP date or anything else
    is no Retry-After: every caller then pauses as it would without one
    (the waiting acquire's back-off, send's retries, the keep-alive's
    pause), rather than go again at once, in a busy loop."""
    if value is None:
        return None
    value = value.strip()
    if not (value.isascii() and value.isdigit()):
        return None
    secs = int(value) if len(value) <= 12 else 10 ** 12  # every caller caps it anyway
    return float(secs) if secs > 0 else None


def _api_error(status: int, headers: Any, raw: bytes) -> FencedError:
    retry_after = _retry_after(headers.get("Retry-After") if headers is not None else None)
    try:
        err = json.loads(raw)["error"]
        code, message = err["code"], err["message"]
    except (ValueError, KeyError, TypeError):
        text = raw[:200].decode("utf-8", "replace")
        if status == 503:
            return UnavailableError(text or "service unavailable", status, retry_after=retry_after)
        return FencedError(f"not an API error: {text!r}", status, retry_after=retry_after)
    cls = _ERRORS.get(code, FencedError)
    held_by = err.get("token")
    if code == "held" and isinstance(held_by, int) and not isinstance(held_by, bool):
        cls = HeldByOtherError  # a force-release with a token
    if code == "unavailable" and err.get("field") == "ttl_ms":
        # The grant came back with no validity left and was released:
        # not acquired, nobody holds the lock (docs/design.md, defect 182),
        # as the Go client maps it to lock.ErrTTLTooShort.
        cls = TTLTooShortError
    e = cls(message, status, code, retry_after)
    if isinstance(e, HeldByOtherError):
        e.token = held_by
    if isinstance(err.get("field"), str):
        e.field = err["field"]
    for key in ("max_wait_ms", "waited_ms", "position"):
        if isinstance(err.get(key), int) and not isinstance(err.get(key), bool):
            setattr(e, key, err[key])
    if isinstance(e, LostError) and isinstance(err.get("maybe_released"), bool):
        e.maybe_released = err["maybe_released"]
    return e


def _wait_over(e: HeldError, name: str, kind: str, wait_ms: int, began: float, position: int) -> HeldError:
    """e, the 409 held that ended a wait of wait_ms for name begun at
    began, made to say the call's wait rather than its last request's: a
    wait longer than the server's --max-wait goes in several requests, and
    the last one's waited_ms and message (its own few hundred ms) read as
    if the caller had waited that long. So waited_ms is the call's, from
    its start here, as the Go client's lock.WaitError.Waited; position the
    place the last request that had one reported; and the message the
    server's words with those numbers, the same whether the wait took one
    request or several. A TTLTooShortError says why in words of its own,
    and is left as it is."""
    if type(e) is not HeldError:
        return e
    e.waited_ms = round((time.monotonic() - began) * 1000)
    if position:
        e.position = position
    if kind == "elections":
        what, still = f"election {json.dumps(name)} has another leader", "still led"
    else:
        what, still = f"lock {json.dumps(name)} is held by another holder", "still held"
    e.message = f"{what}; {still} after waiting {e.waited_ms} ms (wait_ms {wait_ms})"
    if e.position:
        e.message += f"; this caller was number {e.position} in its queue"
    e.args = (e.message,)
    return e


def _redirected(method: str, base: str, path: str, status: int, location: str) -> RedirectError:
    """The RedirectError of a request of path to base answered status, a
    redirect to location: the client follows none (http.client never
    does), and it must not be taken for an answer of fenced, which never
    redirects: its body, a JSON object, read as the lock's state, or a page
    taken for a proxy's after fenced acted (so a force-release "may have
    released" the lock). It names where to point the client: location less
    the request's path, when it ends with it (as the Go client's package
    documentation says, "Errors")."""
    where = urllib.parse.urljoin(base + path, location) if location else ""
    shown = _redacted(where, urllib.parse.urlsplit(where)) if where else ""
    said = f"{method} {base}{path}: HTTP {status}, a redirect"
    if not shown:
        msg = (f"{said} without a Location, not fenced's answer: fenced never redirects, so something in front "
               "of it answered: point the client at fenced's own URL")
    else:
        final = shown[:-len(path)] if shown.endswith(path) and len(shown) > len(path) else ""
        msg = (f"{said} to {shown}, not fenced's answer: fenced never redirects, so something in front of it "
               "answered, and the client follows no redirect (a 301 to 303 would turn the request into a GET): "
               + (f"point the client at {final}; nothing was applied" if final else
                  "point the client at the URL fenced answers on; nothing was applied"))
    e = RedirectError(msg, status)
    e.location = shown
    return e


def _cannot_refresh(name: str, e: FencedError) -> LostError:
    """The loss of a kept-alive lease whose refresh cannot be sent (e, a
    CertificateError or ClientCertificateError, is its __cause__)."""
    err = LostError(f"lease of {name!r} lost: the keep-alive gave it up before its deadline, as its refresh cannot be "
                    f"sent ({e.message}); the lock stays held on the server until its TTL runs out", 0)
    err.__cause__ = e
    return err


def _maybe_applied(e: BaseException) -> bool:
    """Whether a refresh or release that failed with e may have been
    applied all the same. Not when fenced itself refused it: a 4xx answer
    with an API error code (held, out_of_order, invalid_argument, ...), or
    the client's own refusal before sending (status 0 with a code); lost
    is the caller's to handle. Anything else may have come after fenced
    applied it: no answer, any 5xx, a 4xx without an API error code (a
    proxy's page), an answer that is not JSON (even a 200), or an
    exception that is not the API's (docs/design.md, defect 114)."""
    if not isinstance(e, FencedError):
        return True
    if isinstance(e, (LostError, RedirectError, CertificateError, ClientCertificateError)):
        # A redirect reached no fenced, a failed handshake sent nothing (a
        # request written before the server refused the client's
        # certificate was not read): nothing was applied.
        return False
    return not (e.code is not None and (e.status == 0 or 400 <= e.status < 500))


def _not_decision(e: BaseException) -> bool:
    """Whether e is an HTTP answer that is not fenced's decision: a 5xx
    other than 503, or a body with no API error code (a proxy's HTML or
    text page of any status, a body that is not JSON, a 200 that is not a
    JSON object, any 2xx but 200: defect 237), as a proxy answers in
    fenced's place when its upstream answer went astray (a 502 or 504
    after fenced acted on the request).
    Such a request may have been applied, as one whose answer was lost:
    one that is safe to send again is (Client._send; docs/design.md,
    defect 119). Not a 503 (retried as it is), nor fenced's own refusals
    (a 4xx with a code, lost included), nor no answer (status 0)."""
    return (isinstance(e, FencedError) and e.status != 0 and e.status != 503
            and not isinstance(e, UnavailableError) and _maybe_applied(e))


# ---------------------------------------------------------------------------
# Lease


class _LostEvent(threading.Event):
    """Lease.lost: a threading.Event whose is_set() and wait() read the
    clock, so that a lease whose deadline has passed says lost when asked,
    not once the keep-alive's thread (if any) gets to run (defect 169)."""

    def __init__(self, lease: "Lease"):
        super().__init__()
        self._lease = lease

    def is_set(self) -> bool:
        return super().is_set() or self._lease._expire_if_due()

    def isSet(self) -> bool:  # threading.Event's old name
        return self.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until lost is set or the deadline passes (then lost is set
        here), or timeout; return is_set()."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            # The deadline may move (a refresh): wait for it as it is now,
            # and look again.
            step = self._lease.deadline - time.monotonic()
            if step <= 0:
                # Past the deadline and not lost: released, or being
                # released; a release that fails leaves it held again.
                step = 0.1
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                step = min(step, left)
            super().wait(step)
        return True


class Lease:
    """A held lease: name, lease_id (the holder's secret), token, ttl_ms
    (the TTL the server granted) and count (how many releases the lock took
    to be freed when it was granted: 1, or more for a reentrant holder's
    acquire of a lock it held; see Client.acquire's holder), and reused
    (whether the grant is a hold that existed before, its token issued then).

    valid_for() says how long the lease is surely still held by the rule
    ttl - elapsed - drift, measured from before the request that granted or
    last refreshed it was sent. keep_alive() refreshes it in a thread at
    ttl/3; lost (a threading.Event) is set, once, when a refresh answers
    lost or the validity runs out without a successful refresh. release()
    stops the keep-alive and releases. A Lease is a context manager that
    releases on exit.

    Reading the state reads the clock: lost.is_set(), lost.wait(),
    check() and valid_for() find a lease whose deadline has passed lost at
    once (lost set, on_lost called, once), as the keep-alive would, though
    its thread has not run yet (a process paused past its deadline by
    SIGSTOP, a GC or swap; a keep-alive stalled or off): the first read
    after the deadline says lost (docs/design.md, defect 169). Call
    check() right before each write; the token checked at the resource is
    what makes a late write harmless.
    """

    def __init__(self, client: Client, doc: dict[str, Any], started: float):
        self._client = client
        self.name: str = doc["name"]
        self.lease_id: str = doc["lease_id"]
        self.token: int = doc["token"]
        self.ttl_ms: int = doc["ttl_ms"]
        #: How many releases the lock took to be freed when this lease was
        #: granted: 1, or more when a reentrant holder acquired a lock it held.
        self.count: int = doc.get("count", 1)
        #: Whether the lease is a hold that existed before this acquisition,
        #: with the token issued then: a holder's reentry, or the grant made
        #: for an earlier request of the same wait whose answer was lost (API
        #: field reused; from a server that does not send it, count > 1, as
        #: the Go client's Lease.Reused).
        self.reused: bool = bool(doc.get("reused", self.count > 1))
        #: Set once, when the lease is known or presumed lost. Its is_set()
        #: and wait() read the clock: past the deadline the lease is lost
        #: when they are called (_LostEvent).
        self.lost: threading.Event = _LostEvent(self)
        #: Why the lease was lost (a LostError), once lost is set.
        self.lost_reason: Optional[FencedError] = None
        self._mu = threading.Lock()
        # One refresh at a time, the caller's or the keep-alive's: each
        # answer sets the validity from its own start and TTL, so two in
        # flight with different TTLs could leave the one the server did not
        # apply last (as the Go client's Lease does).
        self._refreshing = threading.RLock()
        # The grant's attempt began waited_ms after the server had the
        # request, so never before started + waited_ms: the validity runs
        # from there (a wait longer than the TTL must not void the grant).
        started += max(0, int(doc.get("waited_ms", 0))) / 1000.0
        self._deadline = started + max(0.0, validity(self.ttl_ms, started, started))
        # One release() at a time: a second waits for the one in progress,
        # then returns if it released the lease, or sends again if it
        # failed (the lease maybe still held), as the Go client's Release
        # (docs/design.md, defect 118).
        self._releasing = threading.Lock()
        self._released = False  # a release was begun (or done); reset if it failed
        # Drawn by the first release(), sent by every one and by their
        # resends: a release sent again takes off no second hold of a lock
        # its holder holds more than once.
        self._release_id: Optional[str] = None
        self._release_done = False  # the server released it: no longer held
        self._unanswered = False  # a release got no answer: it may have been applied
        self._on_lost: Optional[Callable[[Lease, FencedError], None]] = None
        self._stop = threading.Event()
        # Set by stop_keep_alive and by every successful refresh, which
        # counts in _refreshes and records its start in _refreshed: the
        # keep-alive then plans its next refresh from that one.
        self._wake = threading.Event()
        self._refreshes = 0
        self._refreshed = started
        self._thread: Optional[threading.Thread] = None
        # The keep-alive's latest refresh error, None after a success: the
        # loss at the deadline says it, whoever finds the loss.
        self._last_err: Optional[BaseException] = None

    def __repr__(self) -> str:
        return f"Lease(name={self.name!r}, token={self.token}, ttl_ms={self.ttl_ms})"

    # -- validity ------------------------------------------------------------

    @property
    def deadline(self) -> float:
        """The time.monotonic() at which the lease's validity runs out."""
        with self._mu:
            return self._deadline

    def valid_for(self) -> float:
        """Seconds the lease is still surely held; 0 once lost or released.
        Past the deadline the lease is lost at once (see lost)."""
        if self.lost.is_set() or self._release_done:
            return 0.0
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raise LostError if the lease is lost, its validity ran out, or it
        was released: the check to make right before each write. A lease
        whose deadline has passed is lost when check() is called (lost set,
        on_lost called, once), whether or not the keep-alive's thread has
        run since. Checking is no substitute for the fence: send the token
        too."""
        if self.lost.is_set():  # reads the clock (_LostEvent)
            raise self.lost_reason or LostError("lease lost", 0)
        if self._release_done:
            raise LostError(f"lease of {self.name!r} was released: it no longer holds the lock", 0)
        if time.monotonic() >= self.deadline:
            raise LostError(f"lease of {self.name!r} ran out of validity", 0)

    def fencing_headers(self) -> dict[str, str]:
        """{"Fencing-Token": "<token>"} for a request to the protected resource."""
        return {FENCING_TOKEN_HEADER: str(self.token)}

    # -- refresh and release -------------------------------------------------

    def refresh(self, ttl_ms: Optional[int] = None) -> None:
        """Extend the lease to ttl_ms from now (None: the lease's TTL,
        ttl_ms, as the keep-alive does; it is sent, so the server's default
        does not apply). The validity is computed anew from this refresh: a
        shorter TTL shortens it. Raises LostError if the lease is no longer held (and
        sets lost), and without sending if it was lost, released or out of
        validity before: a lease lost stays lost, even if the server still
        holds it (release() frees that). So does one whose refresh is
        answered after the validity the refresh granted, or after the
        keep-alive saw the validity run out.

        A refresh that fails other than by fenced's own refusal (a 4xx
        with an API error code, such as HeldError or OutOfOrderError) may
        have been applied all the same: no answer (TransportError), any
        5xx (UnavailableError, a proxy's 502 or 504), a 4xx page without
        an API error code, an answer that is not JSON. The validity then
        ends no later than this refresh would have made it end, so a
        shorter ttl_ms that failed shortens it too (docs/design.md, defect
        114). A refresh that fails when the validity is over (so shrunk,
        or failing late) loses the lease at once (lost set, on_lost called,
        as when the validity runs out), and its own error is raised, as
        the Go client's Refresh does (defect 132).

        Each refresh carries a seq (next_refresh_seq), the same in the
        client's own resends of it: one that reaches fenced after a later
        refresh was applied is not applied, so a refresh given up on cannot
        shorten the lease later. OutOfOrderError says this refresh met a
        higher seq of the lease (another Lease with its lease id): not
        applied, the lease is still held and the validity unchanged. A
        fenced older than seq refuses the field: the refresh is then sent
        again at once without it (unordered), and the next tries seq again."""
        # Without a TTL the server would give its default, which the client
        # does not know: a longer lease would shrink, and one whose refresh
        # went unanswered would look valid past the server's expiry
        # (docs/design.md, defect 113).
        self._refresh(ttl_ms, None, current_ttl=ttl_ms is None)

    def _refresh(self, ttl_ms: Optional[int], retries: Optional[int], current_ttl: bool = False,
                 half: bool = False) -> None:
        # A loss this refresh finds is recorded under _refreshing, and
        # on_lost called once it is let go: an on_lost that calls release()
        # joins a keep-alive that may be waiting for _refreshing, and both
        # would hang (docs/design.md, defect 116).
        found: list[FencedError] = []
        try:
            with self._refreshing:
                if current_ttl:  # read once the refresh before is done: it may have changed it
                    ttl_ms = self.ttl_ms
                self._refresh_one(ttl_ms, retries, half, found)
        finally:
            for err in found:
                self._notify_lost(err)

    def _refresh_one(self, ttl_ms: Optional[int], retries: Optional[int], half: bool,
                     found: list[FencedError]) -> None:
        started = time.monotonic()
        # A lease lost, released or out of validity stays so: a refresh
        # that the server still answers does not make it held again.
        if self._lost_raw():
            raise self.lost_reason or LostError("lease lost", 0)
        if self._released or self._release_done:
            raise LostError(f"lease of {self.name!r} was released: it no longer holds the lock", 0)
        if started >= self.deadline:
            err = LostError(f"lease of {self.name!r} ran out of validity before this refresh", 0)
            self._lose(err, found)
            raise err

        # A time for each request sent (_send): more than one, and an
        # earlier one may have been applied (defect 260).
        sent: list[float] = []

        def send(body: dict[str, Any]) -> dict[str, Any]:
            timeout = None
            remaining = self.deadline - time.monotonic()
            if remaining > 0:
                # No point waiting past the validity for an answer. With
                # half (the keep-alive), half of what is left, at least
                # 50 ms: a connection gone silent (a frozen node, a dropped
                # route) must not use up the validity while a new one
                # could refresh; the keep-alive sends it again soon
                # (docs/design.md, defect 110).
                limit = min(max(remaining / 2, 0.05), remaining) if half else remaining
                timeout = min(self._client.timeout, max(limit, 0.001))
            return self._client._call("POST", self.name, "/refresh", body,
                                      timeout=timeout, retries=retries, resend_lost=True, sent=sent)
        # Drawn once for this refresh, under _refreshing so that the
        # lease's refreshes go out in the order of their seqs, and sent
        # again with it: fenced applies none below the highest it applied,
        # so this one, if delayed on its way past its timeout, cannot
        # shorten the lease after a later one extended it (defect 102).
        body: dict[str, Any] = {"lease_id": self.lease_id, "seq": next_refresh_seq()}
        if ttl_ms is not None:
            body["ttl_ms"] = ttl_ms
        try:
            try:
                doc = send(body)
            except InvalidArgumentError as e:
                if e.field is not None:
                    raise
                # A fenced older than seq refuses it as an unknown field
                # (400, no field; the rest of the body is valid): send this
                # refresh again at once without it, unordered as before
                # (docs/design.md, defect 102). Not remembered: the next
                # refresh carries a seq again, for a server upgraded since.
                del body["seq"]
                sent.clear()  # a fenced that refuses seq applied none of those
                doc = send(body)
            if not (_positive_int(doc.get("token")) and _positive_int(doc.get("ttl_ms"))):
                # A 200 with {} (a proxy, a wrong base URL): no answer of
                # fenced's, so maybe applied (below), and not "lost", as the
                # Go client's Refresh says it; the keep-alive tries again.
                raise FencedError(f"refresh {self.name!r}: the server's answer lacks token or ttl_ms", 200)
        except LostError as e:
            self._lose(e, found)
            raise
        except Exception as e:
            # No answer, a 5xx, a proxy's page: the refresh may have been
            # applied, and a shorter TTL then ends the lease sooner there
            # (defect 100). Only fenced's own refusal (a 4xx with an API
            # error code, out_of_order too) was not applied, and leaves the
            # validity as it was (docs/design.md, defect 114), unless an
            # earlier attempt of it went out and may have been (a handshake
            # refused on a certificate after one: defect 260).
            with self._mu:
                if (_maybe_applied(e) or len(sent) > 1) and ttl_ms is not None:
                    self._deadline = min(self._deadline, started + validity(ttl_ms, started, started))
                deadline = self._deadline
            if time.monotonic() >= deadline:
                # No validity left (this refresh's shorter TTL may have
                # ended it, or it failed late): lost now, as the Go
                # client's Refresh loses it, not at the keep-alive's next
                # wake; on_lost is called once _refreshing is let go
                # (defect 116). The refresh's own error is raised, as Go
                # returns it (docs/design.md, defect 132).
                self._lose(LostError(f"lease of {self.name!r}: no successful refresh before its validity "
                                     f"ran out (last refresh: {e})", 0), found)
            self._wake.set()  # the keep-alive sees the deadline, or the loss
            raise
        if doc.get("token") != self.token:  # a lease's token never changes
            err = LostError(f"refresh of {self.name!r} answered token {doc.get('token')}, not {self.token}", 0)
            self._lose(err, found)
            raise err
        with self._mu:
            self.ttl_ms = doc["ttl_ms"]
            self._deadline = deadline = started + validity(self.ttl_ms, started, started)
            self._refreshed = started
            self._refreshes += 1
        self._wake.set()  # the keep-alive plans from this refresh (a shorter TTL: sooner)
        if time.monotonic() >= deadline:
            # Answered later than the validity it granted: the lease may be
            # gone already, as if the refresh had not come.
            self._lose(LostError(f"refresh of {self.name!r} answered after the validity it granted ran out", 0), found)
        if self._lost_raw():
            # Lost while the refresh was on its way (the keep-alive saw the
            # validity run out first): lost is set once and stays.
            raise self.lost_reason or LostError("lease lost", 0)

    def release(self) -> None:
        """Stop the keep-alive and release the lease; valid_for() is 0 and
        check() raises after it. Calling it again once it succeeded does
        nothing. Raises LostError if the lease was no longer held (it
        expired or was taken over: writes with its token may have been
        rejected). Any other error (TransportError, UnavailableError or a
        proxy's 502 after the client's retries, ...) leaves the lease maybe
        still held: calling release() again sends the release again, which
        is safe: it carries the same release_id (drawn once per lease), so
        a lock held more than once by its holder loses one hold, not two.
        Only one release() runs at a time: one called while another is in
        progress waits for it, then returns if it released the lease, or
        sends again if it failed (docs/design.md, defect 118)."""
        self.stop_keep_alive()  # not under _releasing: an on_lost of the keep-alive may call release()
        found: list[FencedError] = []
        try:
            with self._releasing:
                self._release_one(found)
        finally:
            for err in found:  # once _releasing is let go: on_lost may call release() (defect 116)
                self._notify_lost(err)

    def _release_one(self, found: list[FencedError]) -> None:
        with self._mu:
            if self._released:
                return
            self._released = True
            if self._release_id is None:
                self._release_id = secrets.token_hex(16)
            release_id = self._release_id
        # Lost before: writes under it may have overlapped another holder's,
        # so say so even though the server answers a release of an already
        # released lease id with success (a retry after a lost reply).
        lost_before = self.lost_reason if self._lost_raw() else None
        sent: list[float] = []
        try:
            self._client._release(self.name, self.lease_id, release_id, sent)
        except LostError as e:
            # Sent again after an attempt that got no answer (or a 5xx, a
            # proxy's page: maybe applied), by this call or an earlier one,
            # and answered before the deadline: released, by that
            # attempt. Another fenced node
            # behind the same URL knows nothing of it (with leases in etcd,
            # each remembers its own releases), and before its deadline
            # nothing but a release or a force-release takes a lease away
            # (docs/design.md, defect 97). Unless the server is sure the
            # lease was gone before any release of it (maybe_released
            # false: expired, force-released, lost to a Redis restart):
            # that is a loss, as in the Go client (defect 190). True, or
            # absent (a server before it), is forgiven.
            if not ((len(sent) > 1 or self._unanswered) and time.monotonic() < self.deadline
                    and e.maybe_released is not False):
                self._lose(e, found)
                raise
        except BaseException as e:
            with self._mu:
                self._released = False  # maybe still held: a later release() sends again
                if _maybe_applied(e) or len(sent) > 1:
                    # And maybe released (no answer, a 5xx, a proxy's page
                    # after fenced released it): see LostError above
                    # (docs/design.md, defect 114). So too when this call
                    # sent it before (sent again only after such a failure:
                    # _send, _request), whatever the last attempt's error:
                    # a handshake refused on a certificate now says nothing
                    # of the attempt that went out before it (defect 260).
                    self._unanswered = True
                unanswered = self._unanswered
            if isinstance(e, (CertificateError, ClientCertificateError)) and not unanswered:
                # Nothing reached the server, by this call or before: it holds the
                # lock, for nobody, until its TTL runs out. Said, as the
                # Go client's Release says it.
                raise type(e)(f"{e.message}: {self.name!r} not released: the release cannot be sent, and the lock "
                              "stays held on the server until its TTL runs out", e.status) from e.__cause__
            raise
        self._release_done = True
        if lost_before is not None:
            raise lost_before

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except FencedError:
            if exc_type is None:
                raise
            # The with block's own exception says more.

    # -- keep-alive ----------------------------------------------------------

    def keep_alive(self, on_lost: Optional[Callable[["Lease", FencedError], None]] = None) -> None:
        """Refresh the lease every ttl/3 in a daemon thread of its own, with
        the TTL it was granted. A refresh that answers lost, or a validity
        that runs out without a successful refresh, sets lost and calls
        on_lost(lease, error) once, from the thread that found the loss
        (the keep-alive's, or a refresh() or release() caller's), with none
        of the lease's locks held: on_lost may call release(). Every other
        error (a 503, a proxy's 502, a 401 while fenced reloads its token
        file, OutOfOrderError, ...) is retried until then, after its
        Retry-After, but never later than a third of the validity left,
        and never sooner than min(ttl/10, 1 s), as the Go client's
        keep-alive: no answer makes it a busy loop (a Retry-After of 0
        counts as none; docs/design.md, defects 115 and 116). But a
        refresh whose TLS handshake fails on a certificate
        (CertificateError, ClientCertificateError) fails so until someone
        changes one, and was not sent: the lease is lost at once, with a
        LostError whose __cause__ is that error, and which says the server
        holds the lock until its TTL runs out. An on_lost
        that raises is logged (logger "fenced"). on_lost is called, not
        awaited: an async def one is not run, and its coroutine is closed
        and logged as an error (defect 136). The first refresh is a
        third of the TTL after the grant (or the latest refresh), however
        late the keep-alive starts: at once if that is past. A refresh() meanwhile counts: the next
        refresh is a third of its TTL after it.
        release() or stop_keep_alive() stops the thread and waits for it."""
        with self._mu:
            if self._thread is not None:
                raise RuntimeError("keep_alive: already running")
            if self._released:
                raise RuntimeError("keep_alive: the lease was released")
            self._on_lost = on_lost
            self._thread = threading.Thread(target=self._keep_alive, name=f"fenced-keep-alive-{self.name}", daemon=True)
        self._thread.start()

    def stop_keep_alive(self) -> None:
        """Stop the keep-alive thread, if any, and wait for it to end (a
        refresh in flight finishes first; its timeout is at most the
        lease's remaining validity)."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()

    def _keep_alive(self) -> None:
        try:
            self._keep_alive_loop()
        finally:
            self._client._drop()  # this thread's connection

    def _keep_alive_loop(self) -> None:
        with self._mu:
            # A third of the TTL after the grant or the latest refresh, not
            # after this start: a keep-alive started later than that
            # refreshes at once, rather than sleep past the validity.
            seen = self._refreshes
            next_refresh = self._refreshed + self.ttl_ms / 3000.0
        last_err: Optional[BaseException] = None  # of the latest refresh, if it failed (and in _last_err)
        while True:
            with self._mu:
                if self._refreshes != seen:
                    # Refreshed since (by this loop, or by refresh() in
                    # another thread, perhaps with a shorter TTL): the next
                    # refresh is a third of the new TTL after that one.
                    seen = self._refreshes
                    next_refresh = self._refreshed + self.ttl_ms / 3000.0
                deadline = self._deadline
            # Wake for the next refresh, or at the deadline if that comes
            # first, or when refreshed or stopped. _wake is cleared before
            # the state is read again, so a refresh after this wait is seen.
            self._wake.wait(max(0.0, min(next_refresh, deadline) - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._mu:
                if self._refreshes != seen:
                    continue  # plan from that refresh
                deadline = self._deadline
            now = time.monotonic()
            if now >= deadline:
                why = f" (last refresh: {last_err})" if last_err is not None else ""
                self._signal_lost(LostError(f"lease of {self.name!r}: no successful refresh before its validity "
                                            f"ran out{why}", 0))
                return
            if now < next_refresh:
                continue
            try:
                self._refresh(None, 0, current_ttl=True, half=True)  # this loop retries, within the validity
                last_err = self._last_err = None
            except LostError:
                return  # refresh signalled it
            except (CertificateError, ClientCertificateError) as e:
                # The handshake failed on a certificate, the server's or
                # the client's: every refresh fails so until someone
                # changes one, and nothing was sent. Retried until the
                # deadline (as defect 115 retries any error), it told the
                # holder only then; it gives the lease up now, as the Go
                # client's keep-alive does (lock.ErrCannotSend). The
                # server still holds the lock, until its TTL runs out.
                self._signal_lost(_cannot_refresh(self.name, e))
                return
            except Exception as e:
                # Any answer but lost leaves the lease held as far as
                # anyone knows: a proxy's 502 or 504, a 500, a 401 or 403
                # while fenced reloads its token file, a page that is not
                # JSON, out_of_order (a later refresh of its lease id was
                # applied)... Refresh again, with a higher seq, within the
                # validity, as the Go client's keep-alive does: the lease
                # is lost only when a refresh answers lost or the validity
                # runs out (docs/design.md, defect 115).
                last_err = self._last_err = e
                # Retry soon, but not in a busy loop, and well within the
                # validity left: fenced's Retry-After (1 s) would outlast a
                # short lease, so it counts up to a third of what is left.
                # Never sooner than min(ttl/10, 1 s), as the Go client's
                # keep-alive: no answer, whatever it says, makes this a
                # busy loop (a load balancer's 503 pages with Retry-After:
                # 0 made it refresh thousands of times a second). The
                # deadline still rules.
                retry_after = getattr(e, "retry_after", None) or 0.0
                floor = min(self.ttl_ms / 10000.0, _MAX_KEEP_ALIVE_PAUSE)
                pause = max(min(retry_after, (self.deadline - time.monotonic()) / 3), floor)
                next_refresh = time.monotonic() + pause

    def _lost_raw(self) -> bool:
        """Whether lost is set, without reading the clock: for the lease's
        own decisions under its locks (_LostEvent.is_set may call
        on_lost)."""
        return threading.Event.is_set(self.lost)

    def _expire_if_due(self) -> bool:
        """Lose the lease if its deadline has passed, as the keep-alive
        does at the deadline (lost set, on_lost called, once), and say
        whether it is lost. Not for a lease released (or being released):
        it is no longer the caller's, and lost stays unset. Called with
        none of the lease's locks held, as on_lost must be."""
        if self._lost_raw():
            return True
        if self._released or self._release_done or time.monotonic() < self.deadline:
            return False
        last_err = self._last_err
        why = f" (last refresh: {last_err})" if last_err is not None else ""
        # The keep-alive's words, as if it had found it.
        self._signal_lost(LostError(f"lease of {self.name!r}: no successful refresh before its validity "
                                    f"ran out{why}", 0))
        return True

    def _lose(self, err: FencedError, found: list[FencedError]) -> None:
        """Set lost for err, once; if this call set it, append err to found,
        for the caller to pass to _notify_lost once it holds no lock."""
        with self._mu:
            if self._lost_raw():
                return
            self.lost_reason = err
            self.lost.set()
        found.append(err)

    def _signal_lost(self, err: FencedError) -> None:
        """Set lost for err and call on_lost, once: only from a thread that
        holds none of the lease's locks (see _lose)."""
        found: list[FencedError] = []
        self._lose(err, found)
        for e in found:
            self._notify_lost(e)

    def _notify_lost(self, err: FencedError) -> None:
        """Call on_lost for the loss err, which _lose recorded: never under
        _refreshing, _releasing or _mu, so that on_lost may call release()
        or refresh() (docs/design.md, defect 116)."""
        with self._mu:
            cb = self._on_lost
        if cb is not None:
            try:
                ret = cb(self, err)
            except Exception:
                # Not the caller's error: the refresh(), release() or
                # keep-alive that found the loss goes on as if the callback
                # had returned, and the callback's error is logged.
                _log.exception("fenced: on_lost callback for lock %r raised", self.name)
                return
            if inspect.isawaitable(ret):
                # An async def on_lost: this client has no event loop to
                # run it on, so it was never run, and said so only by a
                # RuntimeWarning at garbage collection. Say it in the log,
                # and close a coroutine, which ends that warning
                # (docs/design.md, defect 136).
                _log.error("fenced: on_lost callback for lock %r returned an awaitable (an async def?), which "
                           "was not run: the sync client cannot await it; pass a plain function (it may hand "
                           "the loss to an event loop with asyncio.run_coroutine_threadsafe)", self.name)
                close = getattr(ret, "close", None)
                if callable(close):
                    close()

