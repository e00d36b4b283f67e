package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
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

func (f tlsFiles) certificate(tc *tls.Config) error {
	if f.cert == "" {
		return nil
	}
	c, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return fmt.Errorf("%s %s, %s %s: %w", f.certFlag, f.cert, f.keyFlag, f.key, err)
	}
	tc.Certificates = []tls.Certificate{c}
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
