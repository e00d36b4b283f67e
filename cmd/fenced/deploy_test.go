package main_test

import (
	"bufio"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/server"
)

const deployDir = "../../deploy"

// serveFlags are the FENCED_ variables of fenced serve, from its usage.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	_, help, _ := run(t, nil, "serve", "--help")
	vars := map[string]bool{}
	for _, m := range regexp.MustCompile(`\[\$(FENCED_[A-Z_]+)\]`).FindAllStringSubmatch(help, -1) {
		vars[m[1]] = true
	}
	return vars
}

// k8sObject is the part of a Kubernetes object the test checks.
type k8sObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
	StringData map[string]string `json:"stringData"`
	Resources  []string          `json:"resources"`
}

type probe struct {
	HTTPGet *struct {
		Path string `json:"path"`
		Port string `json:"port"`
	} `json:"httpGet"`
	TimeoutSeconds int `json:"timeoutSeconds"`
}

type deploymentSpec struct {
	Replicas int `json:"replicas"`
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			TerminationGracePeriodSeconds int `json:"terminationGracePeriodSeconds"`
			Containers                    []struct {
				Args  []string `json:"args"`
				Ports []struct {
					Name          string `json:"name"`
					ContainerPort int    `json:"containerPort"`
				} `json:"ports"`
				Env []struct {
					Name      string          `json:"name"`
					Value     string          `json:"value"`
					ValueFrom json.RawMessage `json:"valueFrom"`
				} `json:"env"`
				VolumeMounts []struct {
					Name      string `json:"name"`
					MountPath string `json:"mountPath"`
				} `json:"volumeMounts"`
				StartupProbe, LivenessProbe, ReadinessProbe *probe
			} `json:"containers"`
			Volumes []struct {
				Name   string `json:"name"`
				Secret *struct {
					SecretName string `json:"secretName"`
				} `json:"secret"`
			} `json:"volumes"`
		} `json:"spec"`
	} `json:"template"`
}

// TestKubernetesManifests parses deploy/kubernetes as kubectl apply -k
// would read it and checks what fenced needs of it: a Deployment that
// scales, probes on /healthz and /readyz, FENCED_ variables that are flags
// of fenced serve, the token file from the Secret in a form fenced loads,
// and a Service, a disruption budget and an autoscaler on the same pods.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(deployDir, "kubernetes")
	var kust k8sObject
	readYAML(t, filepath.Join(dir, "kustomization.yaml"), &kust)
	objs := map[string]k8sObject{}
	for _, r := range kust.Resources {
		var o k8sObject
		readYAML(t, filepath.Join(dir, r), &o)
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Fatalf("%s: not a Kubernetes object: %+v", r, o)
		}
		objs[o.Kind] = o
	}
	for _, k := range []string{"Deployment", "Service", "Secret", "PodDisruptionBudget", "HorizontalPodAutoscaler"} {
		if _, ok := objs[k]; !ok {
			t.Fatalf("no %s in kustomization.yaml's resources %v", k, kust.Resources)
		}
	}

	var d deploymentSpec
	if err := json.Unmarshal(objs["Deployment"].Spec, &d); err != nil {
		t.Fatal(err)
	}
	pods := d.Template.Metadata.Labels
	if d.Replicas < 2 || !subset(d.Selector.MatchLabels, pods) {
		t.Errorf("Deployment: %d replicas, selector %v of pods %v", d.Replicas, d.Selector.MatchLabels, pods)
	}
	if len(d.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment: %d containers, want fenced alone", len(d.Template.Spec.Containers))
	}
	c := d.Template.Spec.Containers[0]
	if !slices.Equal(c.Args, []string{"serve"}) || len(c.Ports) != 1 || c.Ports[0].ContainerPort != 7070 {
		t.Errorf("container: args %v, ports %+v; want serve on 7070", c.Args, c.Ports)
	}
	port := c.Ports[0].Name
	for _, p := range []struct {
		name string
		p    *probe
		path string
	}{{"startupProbe", c.StartupProbe, "/healthz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if p.p == nil || p.p.HTTPGet == nil || p.p.HTTPGet.Path != p.path || p.p.HTTPGet.Port != port {
			t.Errorf("%s: %+v, want GET %s on port %s", p.name, p.p, p.path, port)
		}
	}
	flags := serveFlags(t)
	env := map[string]string{}
	for _, e := range c.Env {
		if !flags[e.Name] {
			t.Errorf("env %s is not a flag of fenced serve", e.Name)
		}
		env[e.Name] = e.Value
	}
	if env["FENCED_LISTEN"] != "0.0.0.0:7070" || env["FENCED_ETCD_ENDPOINTS"] == "" || env["FENCED_REDIS_ADDR"] == "" {
		t.Errorf("env %v: want fenced listening on every interface, with external etcd and Redis", env)
	}
	if ready, err := time.ParseDuration(env["FENCED_READY_TIMEOUT"]); err != nil || ready >= time.Duration(c.ReadinessProbe.TimeoutSeconds)*time.Second {
		t.Errorf("FENCED_READY_TIMEOUT %q: want it below the readiness probe's timeout of %ds", env["FENCED_READY_TIMEOUT"], c.ReadinessProbe.TimeoutSeconds)
	}
	if d.Template.Spec.TerminationGracePeriodSeconds <= 10 {
		t.Errorf("terminationGracePeriodSeconds %d: want more than --shutdown-grace (10s)", d.Template.Spec.TerminationGracePeriodSeconds)
	}
	// The token file is a key of the Secret, mounted where
	// FENCED_AUTH_TOKEN_FILE says, and fenced can load it.
	tokenFile := env["FENCED_AUTH_TOKEN_FILE"]
	secret := objs["Secret"]
	var mounted bool
	for _, m := range c.VolumeMounts {
		for _, v := range d.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == secret.Metadata.Name {
				content, ok := secret.StringData[filepath.Base(tokenFile)]
				if filepath.Dir(tokenFile) == m.MountPath && ok {
					mounted = true
					// Applied unedited, its placeholders must not be
					// tokens: everyone who read the file knows them.
					if _, err := server.ParseTokens([]byte(content)); err == nil || !strings.Contains(err.Error(), "placeholder") {
						t.Errorf("the Secret's placeholder tokens: %v; want them refused as placeholders", err)
					}
					// With each replaced as its comment says, it loads.
					edited := regexp.MustCompile(`REPLACE-\S+`).ReplaceAllStringFunc(content, func(string) string {
						b := make([]byte, 32)
						rand.Read(b)
						return hex.EncodeToString(b)
					})
					if _, err := server.ParseTokens([]byte(edited)); err != nil {
						t.Errorf("the Secret's tokens, replaced: %v", err)
					}
				}
			}
		}
	}
	if !mounted {
		t.Errorf("FENCED_AUTH_TOKEN_FILE %q is not a key of Secret %s mounted there", tokenFile, secret.Metadata.Name)
	}

	var svc struct {
		Selector map[string]string `json:"selector"`
		Ports    []struct {
			Port       int    `json:"port"`
			TargetPort string `json:"targetPort"`
		} `json:"ports"`
	}
	if err := json.Unmarshal(objs["Service"].Spec, &svc); err != nil {
		t.Fatal(err)
	}
	if !subset(svc.Selector, pods) || len(svc.Ports) != 1 || svc.Ports[0].TargetPort != port {
		t.Errorf("Service: %+v does not reach the pods %v on port %s", svc, pods, port)
	}
	var pdb struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
	}
	if err := json.Unmarshal(objs["PodDisruptionBudget"].Spec, &pdb); err != nil || !subset(pdb.Selector.MatchLabels, pods) {
		t.Errorf("PodDisruptionBudget: %+v, %v", pdb, err)
	}
	var hpa struct {
		ScaleTargetRef struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicas int `json:"minReplicas"`
	}
	if err := json.Unmarshal(objs["HorizontalPodAutoscaler"].Spec, &hpa); err != nil ||
		hpa.ScaleTargetRef.Kind != "Deployment" || hpa.ScaleTargetRef.Name != objs["Deployment"].Metadata.Name || hpa.MinReplicas < 2 {
		t.Errorf("HorizontalPodAutoscaler: %+v, %v", hpa, err)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func subset(sub, of map[string]string) bool {
	if len(sub) == 0 {
		return false
	}
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return true
}

// TestSystemdUnit checks deploy/systemd: fenced serve with its flags from
// the environment file, a reload that is SIGHUP, and a stop timeout longer
// than the shutdown grace.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	unit := map[string]string{}
	section := ""
	for _, l := range lines(t, filepath.Join(deployDir, "systemd", "fenced.service")) {
		switch {
		case strings.HasPrefix(l, "["):
			section = strings.Trim(l, "[]")
		case strings.Contains(l, "="):
			k, v, _ := strings.Cut(l, "=")
			unit[section+"."+k] = v
		}
	}
	for k, want := range map[string]string{
		"Service.ExecStart":       "/usr/local/bin/fenced serve",
		"Service.ExecReload":      "/bin/kill -HUP $MAINPID",
		"Service.KillSignal":      "SIGTERM",
		"Service.EnvironmentFile": "/etc/fenced/fenced.env",
		"Install.WantedBy":        "multi-user.target",
	} {
		if unit[k] != want {
			t.Errorf("%s=%q, want %q", k, unit[k], want)
		}
	}
	if d, err := time.ParseDuration(unit["Service.TimeoutStopSec"]); err != nil || d <= 10*time.Second {
		t.Errorf("TimeoutStopSec=%q: want more than --shutdown-grace (10s)", unit["Service.TimeoutStopSec"])
	}
	flags := serveFlags(t)
	env := map[string]string{}
	for _, l := range lines(t, filepath.Join(deployDir, "systemd", "fenced.env")) {
		k, v, ok := strings.Cut(l, "=")
		if !ok || !flags[k] {
			t.Errorf("fenced.env: %q is not a FENCED_ variable of fenced serve", l)
		}
		env[k] = v
	}
	if env["FENCED_AUTH_TOKEN_FILE"] == "" || !strings.HasPrefix(env["FENCED_AUTH_TOKEN_FILE"], strings.Fields(unit["Service.ReadOnlyPaths"])[0]) {
		t.Errorf("FENCED_AUTH_TOKEN_FILE %q: want a token file under ReadOnlyPaths %q", env["FENCED_AUTH_TOKEN_FILE"], unit["Service.ReadOnlyPaths"])
	}
}

// lines returns the lines of a file that are neither blank nor comments.
func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ls []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			ls = append(ls, l)
		}
	}
	return ls
}

// TestDashboardAndAlertsMetrics checks every fenced_ metric and label that
// deploy/grafana's dashboard and deploy/prometheus's alerts query against
// what a running fenced exports: a dashboard or an alert on a name that
// does not exist shows nothing and never fires.
func TestDashboardAndAlertsMetrics(t *testing.T) {
	t.Parallel()
	var exprs []string
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	readYAML(t, filepath.Join(deployDir, "prometheus", "fenced-alerts.yaml"), &rules)
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v: want alert, expr, a severity and a summary", r)
			}
			exprs = append(exprs, r.Expr)
			alerts++
			if r.Alert == "FencedSlowRequests" {
				slowRequestsLeaveOutWaits(t, r.Expr)
			}
		}
	}
	var dash struct {
		Title      string `json:"title"`
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Query string `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile(filepath.Join(deployDir, "grafana", "fenced-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("fenced-dashboard.json: %v", err)
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Query)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	if alerts < 5 || len(dash.Panels) < 8 || dash.UID == "" {
		t.Fatalf("%d alerts, %d panels, uid %q", alerts, len(dash.Panels), dash.UID)
	}

	// What fenced exports, with leases in Redis so that every backend's
	// metrics have samples, and TLS for its certificate's.
	p := newPKI(t)
	_, url := startDev(t, nil, "--redis-addr", testenv.RedisAddr(), "--redis-prefix", testenv.Name(t)+":", "--tls-cert", p.certFile, "--tls-key", p.keyFile)
	a := newAPI(t, url).withTLS(&tls.Config{RootCAs: p.Pool})
	name := testenv.Name(t)
	l := a.acquire(name, 1000)
	a.must(200, "POST", "/v1/locks/"+name+"/refresh", `{"lease_id":"`+l.id+`"}`)
	a.held(name)
	a.release(name, l.id)
	_, body := a.text("/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}

	selector := regexp.MustCompile(`\b(fenced_[a-z_]+)(\{([^}]*)\})?`)
	matcher := regexp.MustCompile(`([a-zA-Z_]+)\s*(?:=~|!~|!=|=)`)
	by := regexp.MustCompile(`\bby \(([^)]*)\)`)
	for _, e := range exprs {
		labels := map[string]bool{"le": true, "instance": true, "job": true}
		for _, m := range selector.FindAllStringSubmatch(e, -1) {
			mf := family(families, m[1])
			if mf == nil {
				t.Errorf("%s in %q: fenced does not export it", m[1], e)
				continue
			}
			have := map[string]bool{"instance": true, "job": true}
			for _, mm := range mf.GetMetric() {
				for _, lp := range mm.GetLabel() {
					have[lp.GetName()] = true
					labels[lp.GetName()] = true
				}
			}
			for _, lm := range matcher.FindAllStringSubmatch(m[3], -1) {
				if !have[lm[1]] {
					t.Errorf("%s{%s} in %q: %s has no label %s", m[1], m[3], e, mf.GetName(), lm[1])
				}
			}
		}
		for _, m := range by.FindAllStringSubmatch(e, -1) {
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); !labels[l] {
					t.Errorf("by (%s) in %q: no metric of the query has the label %s", m[1], e, l)
				}
			}
		}
	}
}

// slowRequestsLeaveOutWaits checks that the slow-request alert leaves out
// every route whose requests wait by design (an acquire's wait_ms, a
// campaign's, an observer's long poll) and no other: it fired whenever
// elections were used, with their long polls' p99 near a minute.
func slowRequestsLeaveOutWaits(t *testing.T, expr string) {
	t.Helper()
	m := regexp.MustCompile(`route!~"((?:[^"\\]|\\.)*)"`).FindStringSubmatch(expr)
	if m == nil {
		t.Errorf("FencedSlowRequests %q: want a route!~ matcher leaving out the routes that wait", expr)
		return
	}
	re, err := regexp.Compile("^(?:" + strings.ReplaceAll(m[1], `\\`, `\`) + ")$") // PromQL unescapes, and anchors
	if err != nil {
		t.Fatalf("FencedSlowRequests's route regexp: %v", err)
	}
	for route, waits := range map[string]bool{
		"/v1/locks/{name}/acquire": true, "/v1/elections/{name}/campaign": true, "/v1/elections/{name}": true,
		"/v1/locks/{name}/release": false, "/v1/locks/{name}/refresh": false, "/v1/locks/{name}": false,
	} {
		if re.MatchString(route) != waits {
			t.Errorf("FencedSlowRequests leaves out %s: %v, want %v", route, !waits, waits)
		}
	}
}

// family finds a metric family by a name as PromQL writes it: a
// histogram's series have _bucket, _sum and _count after its name.
func family(fs map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if mf := fs[name]; mf != nil {
		return mf
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if mf := fs[base]; mf != nil && mf.GetType() == dto.MetricType_HISTOGRAM {
				return mf
			}
		}
	}
	return nil
}
