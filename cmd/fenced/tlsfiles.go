package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"
)

// tlsFiles are the PEM files a set of TLS flags names, and the flags'
// names for errors. One helper for the four uses: the API's server side
// (--tls-cert, --tls-key, --tls-client-ca), and the client side of Redis,
// etcd and fenced exec.
type tlsFiles struct {
	ca, cert, key, serverName string
	// The flags, e.g. "--redis-tls-ca"; caFlag may be "" when there is none.
	caFlag, certFlag, keyFlag string
}

// check reports a certificate without its key, or a key without its
// certificate.
func (f tlsFiles) check(cmd string) error {
	if (f.cert == "") != (f.key == "") {
		return usagef(cmd, "%s and %s go together: give both or neither", f.certFlag, f.keyFlag)
	}
	return nil
}

// client is the TLS configuration of a client: f.ca verifies the server
// (empty: the system's roots), f.cert and f.key are presented for mutual
// TLS.
func (f tlsFiles) client() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.serverName}
	if f.ca != "" {
		pool, err := loadCertPool(f.ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.caFlag, err)
		}
		tc.RootCAs = pool
	}
	if err := f.certificate(tc); err != nil {
		return nil, err
	}
	return tc, nil
}

// server is the TLS configuration of a server: f.cert and f.key are its
// certificate; f.ca, if set, is the CA every client's certificate must be
// signed by (mutual TLS).
func (f tlsFiles) server() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if err := f.certificate(tc); err != nil {
		return nil, err
	}
	if f.ca != "" {
		pool, err := loadCertPool(f.ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.caFlag, err)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// certificate loads f.cert and f.key into tc, refusing a certificate
// outside its validity now: served, every handshake would fail, and only
// as a line per connection in the log.
func (f tlsFiles) certificate(tc *tls.Config) error {
	if f.cert == "" {
		return nil
	}
	c, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return fmt.Errorf("%s %s, %s %s: %w", f.certFlag, f.cert, f.keyFlag, f.key, err)
	}
	if err := checkValidity(c, time.Now()); err != nil {
		return fmt.Errorf("%s %s: %w", f.certFlag, f.cert, err)
	}
	tc.Certificates = []tls.Certificate{c}
	return nil
}

// checkValidity refuses a certificate whose leaf has expired or is not
// valid yet at now.
func checkValidity(c tls.Certificate, now time.Time) error {
	leaf := c.Leaf
	if leaf == nil { // LoadX509KeyPair fills it, unless GODEBUG x509keypairleaf=0
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return err
		}
	}
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Errorf("the certificate expired at %s (%s ago): renew it",
			leaf.NotAfter.UTC().Format(time.RFC3339), now.Sub(leaf.NotAfter).Round(time.Second))
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("the certificate is not valid before %s (%s from now): check this machine's clock, or the certificate's dates",
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotBefore.Sub(now).Round(time.Second))
	}
	return nil
}

func loadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s has no PEM certificate", path)
	}
	return pool, nil
}
