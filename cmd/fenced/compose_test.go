package main_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// composeFile is the part of docker-compose.yml the test checks.
type composeFile struct {
	Services map[string]composeService `json:"services"`
}

type composeService struct {
	Image string `json:"image"`
	Build *struct {
		Context string `json:"context"`
		Target  string `json:"target"`
	} `json:"build"`
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment"`
	Healthcheck *struct {
		Test []string `json:"test"`
	} `json:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on"`
}

// TestDockerCompose checks docker-compose.yml and the Dockerfile without a
// Docker engine (none runs here): the services, their health checks and
// start order, and that fenced's FENCED_* variables are real flags of
// fenced serve.
func TestDockerCompose(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, name := range []string{"etcd1", "etcd2", "etcd3", "redis", "postgres", "fenced", "ledger"} {
		s, ok := c.Services[name]
		if !ok {
			t.Fatalf("no service %s", name)
		}
		// Every long-running service has a health check; the ledger runs
		// to the end.
		if name != "ledger" && (s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 || !strings.HasPrefix(s.Healthcheck.Test[0], "CMD")) {
			t.Errorf("service %s: no health check", name)
		}
	}
	needs := func(svc string, deps ...string) {
		t.Helper()
		for _, d := range deps {
			if got := c.Services[svc].DependsOn[d].Condition; got != "service_healthy" {
				t.Errorf("%s depends on %s with condition %q, want service_healthy", svc, d, got)
			}
		}
	}
	needs("fenced", "etcd1", "etcd2", "etcd3", "redis")
	needs("ledger", "postgres", "redis", "fenced")

	// The etcd members form one cluster of three, on etcd v3.7.
	var cluster string
	for _, name := range []string{"etcd1", "etcd2", "etcd3"} {
		s := c.Services[name]
		if !strings.HasPrefix(s.Image, "quay.io/coreos/etcd:v3.7.") {
			t.Errorf("%s image %q, want quay.io/coreos/etcd:v3.7.x", name, s.Image)
		}
		env := s.Environment
		if env["ETCD_NAME"] != name || env["ETCD_ADVERTISE_CLIENT_URLS"] != "http://"+name+":2379" ||
			env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] != "http://"+name+":2380" {
			t.Errorf("%s environment %v", name, env)
		}
		if !strings.Contains(env["ETCD_INITIAL_CLUSTER"], name+"=http://"+name+":2380") {
			t.Errorf("%s is not in its initial cluster %q", name, env["ETCD_INITIAL_CLUSTER"])
		}
		if cluster != "" && env["ETCD_INITIAL_CLUSTER"] != cluster {
			t.Errorf("%s initial cluster %q differs from %q", name, env["ETCD_INITIAL_CLUSTER"], cluster)
		}
		cluster = env["ETCD_INITIAL_CLUSTER"]
	}

	// fenced serve with Redis leases and the three etcd members, built
	// from the Dockerfile's fenced stage; every FENCED_ variable is a flag.
	f := c.Services["fenced"]
	if f.Build == nil || f.Build.Context != "." || f.Build.Target != "fenced" || len(f.Command) == 0 || f.Command[0] != "serve" {
		t.Errorf("fenced: build %+v, command %v", f.Build, f.Command)
	}
	if f.Environment["FENCED_LEASE_STORE"] != "redis" || f.Environment["FENCED_REDIS_ADDR"] != "redis:6379" ||
		f.Environment["FENCED_ETCD_ENDPOINTS"] != "http://etcd1:2379,http://etcd2:2379,http://etcd3:2379" {
		t.Errorf("fenced environment %v", f.Environment)
	}
	_, help, _ := run(t, nil, "serve", "--help")
	for k := range f.Environment {
		if !strings.Contains(help, "[$"+k+"]") {
			t.Errorf("fenced environment %s is not a flag of fenced serve", k)
		}
	}
	// The ledger's fenced mode goes through the fenced service.
	if l := c.Services["ledger"]; l.Build == nil || l.Build.Target != "ledger" || l.Environment["DATABASE_URL"] == "" ||
		l.Environment["FENCED_URL"] != "http://fenced:7070" {
		t.Errorf("ledger: build %+v, environment %v; want FENCED_URL the fenced service", l.Build, l.Environment)
	}

	// The Dockerfile has the stages compose builds.
	d, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{`(?m)^FROM golang:1\.\d+\S* AS build$`, `(?m)^FROM \S+ AS fenced$`, `(?m)^FROM \S+ AS ledger$`,
		`go build .* ./cmd/fenced`, `go build .* ./examples/ledger`, `(?m)^ENTRYPOINT \["/usr/local/bin/fenced"\]`} {
		if !regexp.MustCompile(re).Match(d) {
			t.Errorf("Dockerfile does not match %s", re)
		}
	}
}
