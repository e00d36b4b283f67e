package main_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestUntrustedCertificateNamesTheFlag: a server certificate the client
// does not trust fails fenced exec, elect and locks at once (fenced exec
// --wait 20s rode it out for 20 s before), and the message says what to do
// in the command's terms: the flag that gives the CA, or that the one
// given does not hold it, or --url for a host the certificate does not
// name.
func TestUntrustedCertificateNamesTheFlag(t *testing.T) {
	t.Parallel()
	p, other := newPKI(t), newPKI(t)
	_, url := startDev(t, nil, "--tls-cert", p.certFile, "--tls-key", p.keyFile)
	_, port, _ := strings.Cut(strings.TrimPrefix(url, "https://"), ":")
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"ExecNoCA", []string{"exec", "--url", url, "--wait", "20s", "NAME", "--", "true"}, "--client-tls-ca FILE (or FENCED_CLIENT_TLS_CA)"},
		{"ExecOtherCA", []string{"exec", "--url", url, "--client-tls-ca", other.File, "--wait", "20s", "NAME", "--", "true"},
			"--client-tls-ca " + other.File + " does not hold the CA"},
		{"ExecHostName", []string{"exec", "--url", "https://localhost:" + port, "--client-tls-ca", p.File, "--wait", "20s", "NAME", "--", "true"},
			"give --url a host name or address"},
		{"Elect", []string{"elect", "--url", url, "--wait", "20s", "NAME", "--", "true"}, "--client-tls-ca FILE"},
		{"Observe", []string{"elect", "--url", url, "--observe", "NAME"}, "--client-tls-ca FILE"},
		{"LocksGet", []string{"locks", "get", "--url", url, "NAME"}, "--client-tls-ca FILE"},
		{"LocksRelease", []string{"locks", "release", "--url", url, "NAME"}, "--client-tls-ca FILE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			failsAtOnce(t, c.args, "a certificate not trusted", "certificate is not trusted", c.want)
		})
	}
}

// TestRefusedClientCertificateNamesTheFlags: a server that requires a
// client certificate (--tls-client-ca) and refuses the client's, or its
// lack of one, fails fenced exec, elect and locks at once (fenced exec
// --wait 20s rode it out for 20 s before), and the message says what to
// do in the command's terms: the flags that give a client certificate, or
// that the one given is not one the server accepts.
func TestRefusedClientCertificateNamesTheFlags(t *testing.T) {
	t.Parallel()
	p, other := newPKI(t), newPKI(t)
	_, url := startDev(t, nil, "--tls-cert", p.certFile, "--tls-key", p.keyFile, "--tls-client-ca", p.File)
	const give = "--client-tls-cert FILE --client-tls-key FILE (or FENCED_CLIENT_TLS_CERT and FENCED_CLIENT_TLS_KEY)"
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"ExecNone", []string{"exec", "--url", url, "--client-tls-ca", p.File, "--wait", "20s", "NAME", "--", "true"}, give},
		{"ExecOtherCA", []string{"exec", "--url", url, "--client-tls-ca", p.File, "--client-tls-cert", other.clientCert, "--client-tls-key", other.clientKey,
			"--wait", "20s", "NAME", "--", "true"}, "--client-tls-cert " + other.clientCert + " is not a certificate the server accepts"},
		{"Elect", []string{"elect", "--url", url, "--client-tls-ca", p.File, "--wait", "20s", "NAME", "--", "true"}, give},
		{"Observe", []string{"elect", "--url", url, "--client-tls-ca", p.File, "--observe", "NAME"}, give},
		{"LocksGet", []string{"locks", "get", "--url", url, "--client-tls-ca", p.File, "NAME"}, give},
		{"LocksRelease", []string{"locks", "release", "--url", url, "--client-tls-ca", p.File, "NAME"}, give},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			failsAtOnce(t, c.args, "a client certificate refused", "the server refused the client's TLS certificate", c.want)
		})
	}
}

// failsAtOnce runs fenced with args (NAME replaced by a lock name) and
// fails t unless it exits 1 within 10 s (it did not ride out what), its
// message holds says and want, and it neither tried again nor doubted:
// nothing reached the server.
func failsAtOnce(t *testing.T, args []string, what, says, want string) {
	t.Helper()
	args = slices.Clone(args)
	args[slices.Index(args, "NAME")] = testenv.Name(t)
	began := time.Now()
	code, _, stderr := run(t, nil, args...)
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("fenced %s took %s: it rode out %s\n%s", strings.Join(args, " "), took.Round(time.Millisecond), what, stderr)
	}
	if code != 1 || !strings.Contains(stderr, says) || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d\n%s\nwant exit 1 and a message that says %q and %q", code, stderr, says, want)
	}
	if strings.Contains(stderr, "trying again") || strings.Contains(stderr, "may have") {
		t.Fatalf("%s\nwant no retry and no doubt: nothing reached the server", stderr)
	}
}
