// Package deploy holds the Kubernetes manifests; its tests check that they do what
// docs/kubernetes.md says, with the gpucr they would run.
package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/gpucr/gpucr/internal/testutil"
)

// The parts of a DaemonSet the checks read.
type daemonSet struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Spec       struct {
		Template struct {
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type podSpec struct {
	HostPID        bool              `yaml:"hostPID"`
	Grace          int               `yaml:"terminationGracePeriodSeconds"`
	NodeSelector   map[string]string `yaml:"nodeSelector"`
	Tolerations    []struct{ Key, Operator, Effect string }
	InitContainers []container `yaml:"initContainers"`
	Containers     []container `yaml:"containers"`
	Volumes        []struct {
		Name     string `yaml:"name"`
		HostPath *struct {
			Path string `yaml:"path"`
		} `yaml:"hostPath"`
	} `yaml:"volumes"`
}

type container struct {
	Name      string   `yaml:"name"`
	Command   []string `yaml:"command"`
	Lifecycle struct {
		PreStop struct {
			Exec struct {
				Command []string `yaml:"command"`
			} `yaml:"exec"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	SecurityContext struct {
		Privileged bool `yaml:"privileged"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

// imageGpucr is where the manifest expects gpucr in its image.
const imageGpucr = "/usr/local/bin/gpucr"

func readDaemonSet(t *testing.T) podSpec {
	t.Helper()
	b, err := os.ReadFile("gpucr-daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds daemonSet
	if err := yaml.Unmarshal(b, &ds); err != nil {
		t.Fatalf("gpucr-daemonset.yaml: %v", err)
	}
	if ds.APIVersion != "apps/v1" || ds.Kind != "DaemonSet" {
		t.Fatalf("gpucr-daemonset.yaml is %s %s, want apps/v1 DaemonSet", ds.APIVersion, ds.Kind)
	}
	return ds.Spec.Template.Spec
}

// hostMounts are the node's directories the pod writes, each mounted at its own path.
func hostMounts(t *testing.T, pod podSpec) []string {
	t.Helper()
	host := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is no hostPath: the pod only writes the node's files", v.Name)
			continue
		}
		host[v.Name] = v.HostPath.Path
	}
	var paths []string
	for _, p := range host {
		paths = append(paths, p)
	}
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		if !c.SecurityContext.Privileged {
			t.Errorf("container %s is not privileged: on SELinux-enforcing nodes it cannot write /etc/criu", c.Name)
		}
		mounted := map[string]bool{}
		for _, m := range c.VolumeMounts {
			mounted[m.Name] = true
			// The script and gpucr's copy run on the node under the paths written into them.
			if m.MountPath != host[m.Name] {
				t.Errorf("container %s mounts %s at %s, not at the node's own path %s", c.Name, m.Name, m.MountPath, host[m.Name])
			}
		}
		for name := range host {
			if !mounted[name] {
				t.Errorf("container %s does not mount %s", c.Name, name)
			}
		}
	}
	return paths
}

func TestDaemonSetRunsOnGPUNodesOnly(t *testing.T) {
	pod := readDaemonSet(t)
	if pod.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("nodeSelector %v: want nvidia.com/gpu.present=true, the GPU nodes' label", pod.NodeSelector)
	}
	tolerates := false
	for _, tol := range pod.Tolerations {
		tolerates = tolerates || tol.Key == "nvidia.com/gpu" && tol.Operator == "Exists"
	}
	if !tolerates {
		t.Errorf("tolerations %v: GPU nodes are often tainted nvidia.com/gpu; the pod must tolerate it", pod.Tolerations)
	}
	hostMounts(t, pod)
}

// The init container's command and the preStop hook, run with the real gpucr on a
// stand-in node (a directory every host path is moved under): the install writes the
// script, gpucr's copy and the configuration lines only inside the mounted host
// directories, keeping the files' other lines; the removal takes out exactly those.
func TestDaemonSetInstallsAndRemovesTheIntegration(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root: the integration installs only into root-owned directories")
	}
	pod := readDaemonSet(t)
	mounts := hostMounts(t, pod)
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 1 {
		t.Fatalf("want one init container (install) and one container (hold), got %d and %d", len(pod.InitContainers), len(pod.Containers))
	}
	install, remove := pod.InitContainers[0].Command, pod.Containers[0].Lifecycle.PreStop.Exec.Command
	// The removal waits for the node's CRIUs, which it sees only in the node's PID namespace.
	if !pod.HostPID {
		t.Error("the pod has no hostPID: its preStop removal cannot see the node's CRIUs to wait for")
	}
	if pod.Grace < 130 {
		t.Errorf("terminationGracePeriodSeconds %d: the preStop removal may wait 2 minutes for CRIUs, within the grace", pod.Grace)
	}

	tmp := t.TempDir()
	gpucr := filepath.Join(tmp, "gpucr")
	build := exec.Command("go", "build", "-o", gpucr, "github.com/gpucr/gpucr/cmd/gpucr")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build gpucr: %v\n%s", err, out)
	}
	node := filepath.Join(tmp, "node")
	// onNode is the manifest's command as it runs here: the image's gpucr is the one just
	// built, and every path in a mounted host directory moves under node.
	onNode := func(args []string) *exec.Cmd {
		t.Helper()
		if len(args) == 0 || args[0] != imageGpucr {
			t.Fatalf("command %q does not run %s", args, imageGpucr)
		}
		out := []string{gpucr}
	next:
		for _, a := range args[1:] {
			if !filepath.IsAbs(a) {
				out = append(out, a)
				continue
			}
			for _, m := range mounts {
				if a == m || strings.HasPrefix(a, m+"/") {
					out = append(out, filepath.Join(node, a))
					continue next
				}
			}
			t.Fatalf("command %q names %s, outside the host directories the pod mounts %v", args, a, mounts)
		}
		return exec.Command(out[0], out[1:]...)
	}
	at := func(p string) string { return filepath.Join(node, p) }
	testutil.WriteFile(t, at("/etc/criu/runc.conf"), []byte("tcp-established\n"))
	testutil.WriteFile(t, at("/etc/criu/crun.conf"), []byte("file-locks\n"))

	if out, err := onNode(install).CombinedOutput(); err != nil {
		t.Fatalf("the init container's install failed: %v\n%s", err, out)
	}
	script := at("/usr/local/libexec/gpucr/criu-action")
	for conf, other := range map[string]string{"runc.conf": "tcp-established", "crun.conf": "file-locks"} {
		b, _ := os.ReadFile(at("/etc/criu/" + conf))
		if want := other + "\naction-script " + script + "\n"; string(b) != want {
			t.Errorf("%s after the install:\n%s\nwant:\n%s", conf, b, want)
		}
	}
	if b, err := os.ReadFile(script); err != nil || !strings.Contains(string(b), "bin='"+at("/usr/local/libexec/gpucr/gpucr")+"'") {
		t.Errorf("the action script does not run gpucr's copy beside it (%v):\n%s", err, b)
	}
	if fi, err := os.Stat(at("/usr/local/libexec/gpucr/gpucr")); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("gpucr's copy on the node: %v", err)
	}
	err := filepath.Walk(node, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		for _, m := range mounts {
			if strings.HasPrefix(p, at(m)+"/") {
				return nil
			}
		}
		t.Errorf("the install wrote %s, outside the host directories the pod mounts %v", p, mounts)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Run as in a pod without hostPID, the removal cannot wait for the node's CRIUs: it
	// changes nothing and says why.
	if _, err := exec.LookPath("unshare"); err == nil {
		own := onNode(remove)
		own.Args = append([]string{"unshare", "--pid", "--fork", "--mount-proc"}, own.Args...)
		own.Path, _ = exec.LookPath("unshare")
		out, err := own.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "PID namespace of its own") {
			t.Errorf("the removal in a PID namespace of its own: %v\n%s", err, out)
		}
		if b, _ := os.ReadFile(at("/etc/criu/runc.conf")); !strings.Contains(string(b), "action-script "+script) {
			t.Errorf("the refused removal changed runc.conf:\n%s", b)
		}
	}
	if out, err := onNode(remove).CombinedOutput(); err != nil {
		t.Fatalf("the preStop removal failed: %v\n%s", err, out)
	}
	for conf, other := range map[string]string{"runc.conf": "tcp-established", "crun.conf": "file-locks"} {
		if b, _ := os.ReadFile(at("/etc/criu/" + conf)); string(b) != other+"\n" {
			t.Errorf("%s after the removal: %q, want only its own line %q", conf, b, other)
		}
	}
	for _, p := range []string{script, at("/usr/local/libexec/gpucr/gpucr")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there after the removal (%v)", p, err)
		}
	}
}
