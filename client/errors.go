package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"reflect"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
)

// ErrNoAnswer: a server took a request but did not answer it within the
// time it had, though the caller's context had not ended: a request that
// asked the server to wait, within that wait and WithAnswerGrace (and
// Observe's first request, within the grace); with
// several servers, a refresh, release, inspect or list within its share
// of the context's deadline. The server may have stopped
// (a partition, a stopped process) or be very slow, and may still have
// acted on the request. It is neither lock.ErrNotAcquired (nobody said the
// lock was held) nor the caller's context.DeadlineExceeded; with several
// servers it comes inside a *ServerError that says which.
var ErrNoAnswer = errors.New("client: no answer from the server in time")

// APIError is an error answer of the fenced server:
// {"error":{"code","message","field"}} with its HTTP status. A body that is
// not in that form (a proxy's error page, say) gives an APIError with an
// empty Code and an excerpt of the body as Message; so does a 2xx other
// than 200, whatever its body: fenced's one success is 200 and its errors
// are 4xx and 5xx, so it is something in front of fenced answering in its
// place, no decision of fenced's, and is sent again as a proxy's page is
// (docs/design.md, defect 243). A redirect (3xx), which
// fenced never sends and the client never follows, gives one with an empty
// Code and a Message that names the URL to point the client at: nothing
// was applied, and the request is not sent again.
//
// It matches the lock package's sentinel errors where the code has the same
// meaning, so errors.Is works as it does with an embedded lock.Client:
// held is lock.ErrNotAcquired, lost is lock.ErrLost, unavailable about
// ttl_ms is lock.ErrTTLTooShort (and so lock.ErrNotAcquired), and an
// invalid_argument about the field name, ttl_ms or lease_id is
// lock.ErrInvalidName, lock.ErrInvalidTTL or lock.ErrInvalidLeaseID. It
// decides by code and field, never by the message.
type APIError struct {
	Status  int           // HTTP status code
	Code    api.ErrorCode // the API's error code, e.g. api.CodeHeld; "" if the body was not an API error
	Field   string        // the request field refused (api.FieldName, …), or ""
	Message string        // the server's explanation, for people
	// Waited and Position, on a 409 after the server waited: how long the
	// request waited and its place in the lock's queue (0: none).
	Waited   time.Duration
	Position int
	// MaxWait, on a 400 about wait_ms, is the longest wait the server
	// allows (its --max-wait), or 0 if it did not say.
	MaxWait time.Duration
	// RetryAfter, on a 503: how long the server asked to wait before the
	// request is sent again (its Retry-After header), or 0.
	RetryAfter time.Duration
	// Token, on the 409 of a force-release with a token, is the token of
	// the grant that holds the lock instead (ForceRelease returns it as a
	// *lock.HeldByOtherError).
	Token fence.Token
	// LostForCertain, on the 410 of a release, says that the store is
	// sure the lease was gone before this release (expired,
	// force-released, lost to a Redis restart), rather than perhaps
	// released by an earlier one whose answer was lost (the answer's
	// maybe_released false). False when the store cannot tell, or the
	// server did not say (one before it).
	LostForCertain bool
}

func (e *APIError) Error() string {
	if e.Code == "" && e.Status >= 300 && e.Status < 400 {
		return fmt.Sprintf("HTTP %d, a redirect, not fenced's answer: %s", e.Status, e.Message)
	}
	if e.Code == "" && e.Status < 300 {
		return fmt.Sprintf("HTTP %d, not fenced's answer (fenced answers 200 or an API error): %s", e.Status, e.Message)
	}
	if e.Code == "" {
		return fmt.Sprintf("fenced answered HTTP %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("fenced answered %s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// Unwrap returns the lock sentinel error that the code stands for, or nil.
func (e *APIError) Unwrap() error {
	switch e.Code {
	case api.CodeHeld:
		return lock.ErrNotAcquired
	case api.CodeLost:
		return lock.ErrLost
	case api.CodeUnavailable:
		if e.Field == api.FieldTTLMs {
			// The grant came back with no validity left: both, as
			// lock.Client's error matches both.
			return errTTLTooShort
		}
	case api.CodeOutOfOrder:
		return lock.ErrOutOfOrder
	case api.CodeInvalidArgument:
		switch e.Field {
		case api.FieldName:
			return lock.ErrInvalidName
		case api.FieldTTLMs:
			return lock.ErrInvalidTTL
		case api.FieldLeaseID:
			return lock.ErrInvalidLeaseID
		}
	}
	return nil
}

// errTTLTooShort is what a 503 about ttl_ms on an acquire stands for.
var errTTLTooShort = errors.Join(lock.ErrTTLTooShort, lock.ErrNotAcquired)

// ServerError is the failure of one of several servers: which, and why.
// A Client of several servers that all failed returns them joined.
type ServerError struct {
	URL string
	Err error
}

func (e *ServerError) Error() string { return e.URL + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *ServerError) Unwrap() error { return e.Err }

// ErrCertificate: the TLS handshake failed on the server's certificate,
// which the client does not trust: signed by a CA it was not given
// (WithTLSConfig's RootCAs, else the system's roots), or not issued for the
// host of the URL. Every handshake fails alike until the client is given
// the CA (or a URL the certificate names), so it is no transient failure:
// nothing reached the server, and the request is not sent again, nor waited
// out by an Acquire's WithWait; a lease's keep-alive refresh that fails so
// loses the lease at once (it also matches lock.ErrCannotSend). With several servers, one whose
// certificate is not trusted is passed over as one that cannot be reached,
// and the error matches ErrCertificate only when every server's was not
// trusted. The error also holds the crypto/tls one
// (*tls.CertificateVerificationError, with the x509 reason).
var ErrCertificate = errors.New("client: the server's TLS certificate is not trusted")

// ErrClientCertificate: the server refused the TLS handshake over the
// client's own certificate (mutual TLS, fenced serve --tls-client-ca): the
// client presented none, or one the server does not trust (signed by
// another CA, expired, not for client authentication). The server says so
// with a TLS alert (certificate required, unknown CA, bad certificate,
// certificate expired, ...; a TLS 1.2 server that got no certificate
// answers a handshake failure, which counts too), under TLS 1.3 after the
// client's side of the handshake is over, when the request was already
// written: it was not read. Like ErrCertificate it is no transient
// failure and is handled as one (not sent again, nor waited out; a
// keep-alive loses its lease at once; another server is tried), but it is
// a sibling, not the same error: it is the other side's certificate, and
// the remedy differs, a certificate and key in WithTLSConfig's
// Certificates rather than a CA in its RootCAs. A Go client sends only a
// certificate of a CA that the server's request names, and none else: a
// certificate of the wrong CA is mostly refused as none at all
// ("certificate required"). The error also holds the crypto/tls one.
var ErrClientCertificate = errors.New("client: the server refused the client's TLS certificate")

// certificateFailure reports whether err is a handshake that failed on a
// certificate, the server's or the client's, at every server asked.
func certificateFailure(err error) bool {
	return errors.Is(err, ErrCertificate) || errors.Is(err, ErrClientCertificate)
}

// certificateError is the failure of a request whose handshake failed on
// the server's certificate (or, client, on the client's): it says so and
// what to do, and matches ErrCertificate (ErrClientCertificate) and
// lock.ErrCannotSend unless passed over (round: another server may
// answer) or sent before (doNoting: an earlier round's request may have
// been applied).
type certificateError struct {
	method, base, path string
	reason             string // the verification's own words, or the server's alert
	hostname           bool   // signed by a trusted CA, but not for the URL's host
	client             bool   // the server refused the client's certificate
	alert              uint8  // its alert, if client
	err                error  // the HTTP client's error
	passed             bool
	sentBefore         bool // an earlier round sent the request: it may have been applied
}

func (e *certificateError) Error() string {
	if e.client {
		return fmt.Sprintf("client: %s %s%s: the server refused the client's TLS certificate (%s): %s", e.method, e.base, e.path, e.reason, clientCertificateAdvice(e.alert))
	}
	do := fmt.Sprintf("give the client the CA that signed it (WithTLSConfig, a tls.Config whose RootCAs holds it), and check that the certificate names the host of %s", e.base)
	if e.hostname {
		do = fmt.Sprintf("it was not issued for the host of %s: point the client at a name or address the certificate holds", e.base)
	}
	return fmt.Sprintf("client: %s %s%s: the server's TLS certificate is not trusted (%s): %s", e.method, e.base, e.path, e.reason, do)
}

// clientCertificateAdvice is what to do about a client certificate the
// server refused with alert a.
func clientCertificateAdvice(a uint8) string {
	switch a {
	case alertCertificateRequired:
		return "the server requires a client certificate (mutual TLS) and got none: give the client a certificate signed by a CA the server trusts, with its key (WithTLSConfig, a tls.Config whose Certificates holds it); one signed by another CA is not sent"
	case alertHandshakeFailure:
		return "if the server requires a client certificate (mutual TLS), as a TLS 1.2 server says when it got none, give the client a certificate signed by a CA the server trusts, with its key (WithTLSConfig, a tls.Config whose Certificates holds it); one signed by another CA is not sent"
	case alertCertificateExpired:
		return "the client's certificate has expired or is not valid yet: give the client a certificate valid now (WithTLSConfig's Certificates)"
	case alertUnknownCA:
		return "the server does not trust the CA that signed the client's certificate: give the client a certificate signed by a CA the server trusts (WithTLSConfig's Certificates)"
	}
	return "give the client a certificate the server accepts (WithTLSConfig's Certificates): signed by a CA the server trusts, valid now, issued for client authentication"
}

func (e *certificateError) Unwrap() []error {
	which := ErrCertificate
	if e.client {
		which = ErrClientCertificate
	}
	switch {
	case e.passed:
		return []error{e.err}
	case e.sentBefore:
		return []error{which, e.err}
	}
	return []error{which, lock.ErrCannotSend, e.err}
}

// sentAgain marks the certificate errors in err as those of a request an
// earlier round sent, which may have been applied: not lock.ErrCannotSend.
func sentAgain(err error) {
	switch e := err.(type) {
	case *certificateError:
		e.sentBefore = true
	case interface{ Unwrap() error }:
		sentAgain(e.Unwrap())
	case interface{ Unwrap() []error }:
		for _, u := range e.Unwrap() {
			sentAgain(u)
		}
	}
}

// untrustedCertificate returns the certificateError of err, the HTTP
// client's failure of a request to base, if its handshake failed on the
// server's certificate, or the server refused the client's, else nil.
func untrustedCertificate(err error, method, base, path string) *certificateError {
	var (
		cve *tls.CertificateVerificationError
		uae x509.UnknownAuthorityError
		he  x509.HostnameError
		cie x509.CertificateInvalidError
	)
	var reason error
	switch {
	case errors.As(err, &cve): // crypto/tls's own verification
		reason = cve.Err
	case errors.As(err, &uae): // a tls.Config's VerifyPeerCertificate or VerifyConnection
		reason = uae
	case errors.As(err, &he):
		reason = he
	case errors.As(err, &cie):
		reason = cie
	default:
		if a, words, ok := refusedCertificate(err); ok {
			return &certificateError{method: method, base: base, path: path, reason: words, client: true, alert: a, err: err}
		}
		return nil
	}
	return &certificateError{method: method, base: base, path: path, reason: reason.Error(), hostname: errors.As(reason, &he), err: err}
}

// The TLS alerts (RFC 8446, 6.2) by which a server refuses the client's
// certificate. From a server, each is about the certificate the client
// sent, or did not send: a TLS 1.2 server that requires one answers
// handshake_failure when it got none (TLS 1.3 has certificate_required).
const (
	alertHandshakeFailure       = 40
	alertBadCertificate         = 42
	alertUnsupportedCertificate = 43
	alertCertificateRevoked     = 44
	alertCertificateExpired     = 45
	alertCertificateUnknown     = 46
	alertUnknownCA              = 48
	alertCertificateRequired    = 116
)

// refusedCertificate reports the alert of err, and its words, if it is a
// TLS alert from the server (a "remote error") that refuses the client's
// certificate. crypto/tls reports an alert it received as a *net.OpError
// whose Err is its unexported alert type, a uint8: the alert is read by
// its code, never by its text. (A tls.AlertError, over QUIC, is one the
// client sent, not one it received.)
func refusedCertificate(err error) (code uint8, words string, ok bool) {
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "remote error" || oe.Err == nil {
		return 0, "", false
	}
	v := reflect.ValueOf(oe.Err)
	if v.Kind() != reflect.Uint8 || v.Type().PkgPath() != "crypto/tls" {
		return 0, "", false
	}
	switch code = uint8(v.Uint()); code {
	case alertHandshakeFailure, alertBadCertificate, alertUnsupportedCertificate, alertCertificateRevoked,
		alertCertificateExpired, alertCertificateUnknown, alertUnknownCA, alertCertificateRequired:
		return code, oe.Error(), true
	}
	return 0, "", false
}
