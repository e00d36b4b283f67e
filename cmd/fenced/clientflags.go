package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/fenced/fenced/client"
)

// clientOpts are the flags of every command that talks to a fenced server
// (exec, locks): where it is and how to authenticate. Their environment
// variables (FENCED_URL, FENCED_CLIENT_TOKEN, ...) are distinct from
// serve's.
type clientOpts struct {
	url, token, tokenFile string
	tls                   tlsFiles
	maxReq                time.Duration
	timeout               time.Duration // --timeout, of the commands that register it
}

// registerTimeout adds --timeout, the bound on requests that do not ask
// the server to wait: the client bounds those by their context alone, and
// a server that takes a request and never answers (a partition, a wedged
// process) would hold the command for ever. what says what it bounds.
func (o *clientOpts) registerTimeout(fs *flag.FlagSet, what string) {
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, what)
}

// checkTimeout refuses a --timeout that is not above 0.
func (o *clientOpts) checkTimeout(cmdName string) error {
	if o.timeout <= 0 {
		return usagef(cmdName, "--timeout %s: want > 0", o.timeout)
	}
	return nil
}

// timedOut reports whether bounded, a context made from parent with a
// timeout, ended by that timeout while parent lives: a call that failed
// then ran out of its own time.
func timedOut(parent, bounded context.Context) bool {
	return parent.Err() == nil && errors.Is(bounded.Err(), context.DeadlineExceeded)
}

func (o *clientOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.url, "url", "http://127.0.0.1:7070", "`URL` of the fenced server, or several separated by commas (tried in turn).")
	fs.StringVar(&o.token, "client-token", "", "Bearer `token` for the server; prefer FENCED_CLIENT_TOKEN or --client-token-file to keep it out of ps.")
	fs.StringVar(&o.tokenFile, "client-token-file", "", "Read the bearer token from this `file` (its first line that is not blank or a # comment).")
	o.tls.caFlag, o.tls.certFlag, o.tls.keyFlag = "--client-tls-ca", "--client-tls-cert", "--client-tls-key"
	fs.StringVar(&o.tls.ca, "client-tls-ca", "", "PEM CA `file` to verify the server's certificate. Empty: the system's roots.")
	fs.StringVar(&o.tls.cert, "client-tls-cert", "", "PEM client certificate `file` for mutual TLS (needs --client-tls-key).")
	fs.StringVar(&o.tls.key, "client-tls-key", "", "PEM private key `file` of --client-tls-cert.")
	fs.DurationVar(&o.maxReq, "max-request-wait", client.DefaultMaxRequestWait, "Longest wait_ms of one acquire request; a server with a shorter --max-wait is asked for its longest.")
}

// client checks the flags and makes the client they describe; the caller
// closes it. A bad flag is a usage error of cmdName.
func (o *clientOpts) client(cmdName string) (*client.Client, error) {
	switch {
	// A variable of one of the two loses to the other on the command line
	// (exclusions, defect 139): this refuses two flags, or two variables.
	case o.token != "" && o.tokenFile != "":
		return nil, usagef(cmdName, "--client-token and --client-token-file: give one")
	case o.maxReq < time.Millisecond:
		return nil, usagef(cmdName, "--max-request-wait %s: want at least 1ms", o.maxReq)
	}
	if err := o.tls.check(cmdName); err != nil {
		return nil, err
	}
	if _, err := client.New(o.url); err != nil {
		return nil, usagef(cmdName, "--url: %v", err)
	}
	opts := []client.Option{client.WithMaxRequestWait(o.maxReq)}
	tokenFrom := "--client-token"
	if o.tokenFile != "" {
		var err error
		if o.token, err = readTokenFile(o.tokenFile); err != nil {
			return nil, fmt.Errorf("--client-token-file: %w", err)
		}
		tokenFrom = "--client-token-file " + o.tokenFile
	}
	if o.token != "" {
		opts = append(opts, client.WithBearerToken(o.token))
	}
	if o.tls.ca != "" || o.tls.cert != "" {
		tc, err := o.tls.client()
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLSConfig(tc))
	}
	c, err := client.New(o.url, opts...)
	if err != nil {
		// The URL is good: a bad token, named by where it came from.
		return nil, usagef(cmdName, "%s: %v", tokenFrom, err)
	}
	return c, nil
}

// explainCertificate adds to the error of a server certificate the client
// does not trust (client.ErrCertificate), or of a server that refuses the
// client's (client.ErrClientCertificate), what to do in the flags' terms:
// the client's own words name client.WithTLSConfig, which the command's
// user cannot reach. Every command that talks to a server defers it on its
// error.
func (o *clientOpts) explainCertificate(err *error) {
	var hint string
	switch {
	case errors.Is(*err, client.ErrCertificate):
		var he x509.HostnameError
		hint = "give fenced the CA that signed the server's certificate: --client-tls-ca FILE (or FENCED_CLIENT_TLS_CA)"
		switch {
		case errors.As(*err, &he):
			hint = "give --url a host name or address that the server's certificate holds"
		case o.tls.ca != "":
			hint = fmt.Sprintf("--client-tls-ca %s does not hold the CA that signed the server's certificate: give the file of that CA", o.tls.ca)
		}
	case errors.Is(*err, client.ErrClientCertificate):
		// The server requires a client certificate (its --tls-client-ca).
		// An expired one does not get this far: client() refuses it.
		hint = "the server requires a client certificate (mutual TLS): give fenced one signed by a CA the server trusts (its --tls-client-ca): --client-tls-cert FILE --client-tls-key FILE (or FENCED_CLIENT_TLS_CERT and FENCED_CLIENT_TLS_KEY)"
		if o.tls.cert != "" {
			hint = fmt.Sprintf("--client-tls-cert %s is not a certificate the server accepts: give one signed by a CA the server trusts (its --tls-client-ca), for client authentication", o.tls.cert)
		}
	default:
		return
	}
	var ee *ExitError
	if errors.As(*err, &ee) && ee.Err != nil {
		ee.Err = fmt.Errorf("%w; %s", ee.Err, hint)
		return
	}
	*err = fmt.Errorf("%w; %s", *err, hint)
}
