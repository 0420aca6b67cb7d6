package container

import (
	"errors"
	"strings"
	"testing"
)

// Each engine is told by what it leaves on its containers; a container runc runs directly
// has none of it.
func TestOwner(t *testing.T) {
	cases := []struct {
		name        string
		st          State
		engine, cmd string
	}{
		{"podman", State{ID: "abc", Annotations: map[string]string{"io.container.manager": "libpod"}}, "podman", "podman container checkpoint abc"},
		{"cri-o", State{ID: "abc", Annotations: map[string]string{"io.kubernetes.cri-o.ContainerType": "container"}}, "CRI-O", "kubelet"},
		{"containerd cri", State{ID: "abc", Annotations: map[string]string{"io.kubernetes.cri.container-type": "container"}}, "containerd's CRI plugin", "crictl checkpoint"},
		{"containerd", State{ID: "abc", Bundle: "/run/containerd/io.containerd.runtime.v2.task/default/abc"}, "containerd", "ctr -n default containers checkpoint --task abc"},
		{"docker", State{ID: "abc", Bundle: "/run/containerd/io.containerd.runtime.v2.task/moby/abc"}, "Docker", "docker checkpoint create abc"},
		// containerd's legacy runtime, where Docker 19.03 and before ran its containers.
		{"docker, legacy runtime", State{ID: "abc", Bundle: "/run/containerd/io.containerd.runtime.v1.linux/moby/abc"}, "Docker", "docker checkpoint create abc"},
		{"containerd, legacy runtime", State{ID: "abc", Bundle: "/run/containerd/io.containerd.runtime.v1.linux/k8s/abc"}, "containerd", "ctr -n k8s containers checkpoint --task abc"},
		{"containers/storage", State{ID: "abc", Bundle: "/var/lib/containers/storage/overlay-containers/abc/userdata"}, "podman or CRI-O", "podman container checkpoint abc"},
		{"runc alone", State{ID: "abc", Bundle: "/srv/bundles/abc", Annotations: map[string]string{"org.criu.config": "/etc/criu/x.conf"}}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			engine, cmd, ok := owner(c.st)
			if ok != (c.engine != "") || engine != c.engine || !strings.Contains(cmd, c.cmd) {
				t.Fatalf("owner = %q, %q, %v; want %q and a command with %q", engine, cmd, ok, c.engine, c.cmd)
			}
			err := checkUnowned(c.st)
			if (err != nil) != ok || ok && (!errors.Is(err, ErrEngineOwned) || !strings.Contains(err.Error(), c.cmd)) {
				t.Fatalf("checkUnowned = %v", err)
			}
		})
	}
}
