package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// tlsLookEvery is how often, at most, a handshake looks whether the
// certificate's files changed.
const tlsLookEvery = 10 * time.Second

// servedTLS is the server's TLS configuration (--tls-cert, --tls-key,
// --tls-client-ca), reloaded from its files without a restart: on SIGHUP,
// and when a handshake finds them changed (looked at at most every
// tlsLookEvery). Certificates are rotated by tools that only write new
// files (cert-manager, an ACME client, a Vault agent), and a restart for
// each ended every waiting request. Files that do not load (a rotation
// half written, a certificate expired) leave the configuration in force
// as it was, and the log says why; they are tried again when they change
// or on SIGHUP.
type servedTLS struct {
	files tlsFiles
	log   *slog.Logger
	cur   atomic.Pointer[tls.Config]

	looked atomic.Int64 // the last look at the files, Unix ns: handshakes between looks take no lock
	mu     sync.Mutex   // guards stamp; held while looking and loading
	stamp  string       // the files as they were at the last load tried
}

func newServedTLS(files tlsFiles, log *slog.Logger) (*servedTLS, error) {
	s := &servedTLS{files: files, log: log, stamp: files.stamp()}
	s.looked.Store(time.Now().UnixNano())
	c, err := files.server()
	if err != nil {
		return nil, err
	}
	s.cur.Store(c)
	return s, nil
}

// listener is the configuration to serve with: each handshake gets the
// one in force.
func (s *servedTLS) listener() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: s.forClient}
}

func (s *servedTLS) forClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	if l := s.looked.Load(); time.Now().UnixNano()-l >= int64(tlsLookEvery) && s.looked.CompareAndSwap(l, time.Now().UnixNano()) {
		s.mu.Lock() // this handshake looks; the others go on with the one in force
		if st := s.files.stamp(); st != s.stamp {
			_ = s.reloadLocked("its files changed", st)
		}
		s.mu.Unlock()
	}
	return s.cur.Load(), nil
}

// reload loads the files again (SIGHUP).
func (s *servedTLS) reload(why string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.looked.Store(time.Now().UnixNano())
	return s.reloadLocked(why, s.files.stamp())
}

func (s *servedTLS) reloadLocked(why, stamp string) error {
	s.stamp = stamp // files that failed are tried again once they change
	c, err := s.files.server()
	if err != nil {
		s.log.Error("TLS certificate not reloaded ("+why+"); the one loaded before stays in force until the files load: fix them, or send SIGHUP once they are complete",
			"cert", s.files.cert, "err", err)
		return err
	}
	s.cur.Store(c)
	s.log.Info("TLS certificate reloaded ("+why+")", "cert", s.files.cert, "not_after", notAfter(c).UTC().Format(time.RFC3339))
	return nil
}

// notAfter is when the certificate in force expires.
func (s *servedTLS) notAfter() time.Time { return notAfter(s.cur.Load()) }

func notAfter(c *tls.Config) time.Time {
	if len(c.Certificates) == 0 {
		return time.Time{}
	}
	if leaf := c.Certificates[0].Leaf; leaf != nil {
		return leaf.NotAfter
	}
	if leaf, err := x509.ParseCertificate(c.Certificates[0].Certificate[0]); err == nil {
		return leaf.NotAfter
	}
	return time.Time{}
}

// stamp is the size and modification time of each of f's files, to tell
// whether any changed.
func (f tlsFiles) stamp() string {
	var st string
	for _, p := range []string{f.cert, f.key, f.ca} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			st += fmt.Sprintf("%d@%d;", fi.Size(), fi.ModTime().UnixNano())
		} else {
			st += "missing;"
		}
	}
	return st
}
