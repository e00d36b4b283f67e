package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestKubernetesEmbeddedEtcd checks deploy/kubernetes/embedded-etcd.yaml:
// a StatefulSet whose pods are the members of one etcd cluster, reached
// by name through a headless Service published before they are ready, with
// data on a volume per pod; and, for each pod, that fenced serve accepts
// its variables, $(POD_NAME) expanded as Kubernetes would: it goes past
// every check of its flags and its token file, to the data dir, which
// this test makes fail.
func TestKubernetesEmbeddedEtcd(t *testing.T) {
	t.Parallel()
	path := filepath.Join(deployDir, "kubernetes", "embedded-etcd.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]k8sObject{}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var o k8sObject
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		objs[o.Kind] = o
	}
	var set struct {
		deploymentSpec
		ServiceName          string      `json:"serviceName"`
		PodManagementPolicy  string      `json:"podManagementPolicy"`
		VolumeClaimTemplates []k8sObject `json:"volumeClaimTemplates"`
	}
	if err := json.Unmarshal(objs["StatefulSet"].Spec, &set); err != nil {
		t.Fatal(err)
	}
	var svc struct {
		ClusterIP                string            `json:"clusterIP"`
		PublishNotReadyAddresses bool              `json:"publishNotReadyAddresses"`
		Selector                 map[string]string `json:"selector"`
	}
	if err := json.Unmarshal(objs["Service"].Spec, &svc); err != nil {
		t.Fatal(err)
	}
	pods := set.Template.Metadata.Labels
	if set.ServiceName != objs["Service"].Metadata.Name || svc.ClusterIP != "None" || !svc.PublishNotReadyAddresses || !subset(svc.Selector, pods) {
		t.Errorf("StatefulSet's service %q; Service %s %+v: want it headless, over the pods %v, publishing them before they are ready",
			set.ServiceName, objs["Service"].Metadata.Name, svc, pods)
	}
	if set.PodManagementPolicy != "Parallel" || !subset(set.Selector.MatchLabels, pods) {
		t.Errorf("StatefulSet: pod management %q, selector %v of pods %v; want the members started at once", set.PodManagementPolicy, set.Selector.MatchLabels, pods)
	}
	if len(set.Template.Spec.Containers) != 1 {
		t.Fatalf("StatefulSet: %d containers, want fenced alone", len(set.Template.Spec.Containers))
	}
	c := set.Template.Spec.Containers[0]
	env := map[string]string{}
	flags := serveFlags(t)
	for _, e := range c.Env {
		switch {
		case e.Name == "POD_NAME":
			if !strings.Contains(string(e.ValueFrom), "metadata.name") {
				t.Errorf("POD_NAME from %s, want the pod's name", e.ValueFrom)
			}
		case !flags[e.Name]:
			t.Errorf("env %s is not a flag of fenced serve", e.Name)
		default:
			env[e.Name] = e.Value
		}
	}
	members := strings.Count(env["FENCED_ETCD_INITIAL_CLUSTER"], "=")
	if set.Replicas != 3 || members != set.Replicas {
		t.Errorf("%d replicas, %d members in FENCED_ETCD_INITIAL_CLUSTER: want three, one a pod", set.Replicas, members)
	}
	dataMounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == env["FENCED_ETCD_DATA_DIR"] && slices.ContainsFunc(set.VolumeClaimTemplates, func(v k8sObject) bool { return v.Metadata.Name == m.Name }) {
			dataMounted = true
		}
	}
	if !dataMounted {
		t.Errorf("FENCED_ETCD_DATA_DIR %q is not a volume claimed per pod", env["FENCED_ETCD_DATA_DIR"])
	}

	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range set.Replicas {
		pod := fmt.Sprintf("%s-%d", objs["StatefulSet"].Metadata.Name, i)
		var vars []string
		for k, v := range env {
			switch k {
			case "FENCED_ETCD_DATA_DIR":
				v = filepath.Join(notDir, "data")
			case "FENCED_AUTH_TOKEN_FILE":
				v = tokens
			}
			vars = append(vars, k+"="+strings.ReplaceAll(v, "$(POD_NAME)", pod))
		}
		code, _, stderr := run(t, vars, "serve")
		if code != 1 || !strings.HasPrefix(stderr, "fenced: etcd data dir:") {
			t.Errorf("pod %s: fenced serve exited %d: %s; want it past its flags, failing at the data dir this test made a file", pod, code, stderr)
		}
	}
}
