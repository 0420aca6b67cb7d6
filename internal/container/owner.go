package container

import (
	"errors"
	"fmt"
	"strings"
)

// ErrEngineOwned means a container engine (podman, containerd, CRI-O, Docker) manages the
// container: checkpointing it with runc behind the engine's back kills it as far as the
// engine knows, and the engine then cannot restore it either. The engine's own checkpoint,
// with gpucr's runc integration installed, moves the GPU state instead.
var ErrEngineOwned = errors.New("container is managed by an engine")

// owner names the engine that manages a container, from what the engines leave in its
// annotations and bundle path, and the command that checkpoints it through that engine.
// ok is false for a container nothing manages (runc run directly).
func owner(st State) (engineName, command string, ok bool) {
	has := func(prefix string) bool {
		for k := range st.Annotations {
			if strings.HasPrefix(k, prefix) {
				return true
			}
		}
		return false
	}
	const kubelet = "the kubelet's checkpoint API (POST /checkpoint/NAMESPACE/POD/CONTAINER) or `crictl checkpoint`"
	switch {
	case st.Annotations["io.container.manager"] == "libpod":
		return "podman", "podman container checkpoint " + st.ID, true
	case has("io.kubernetes.cri-o."):
		return "CRI-O", kubelet, true
	case has("io.kubernetes.cri."):
		return "containerd's CRI plugin", kubelet, true
	}
	// containerd keeps bundles at .../RUNTIME/NAMESPACE/ID: io.containerd.runtime.v2.task,
	// or io.containerd.runtime.v1.linux for its legacy runtime (Docker 19.03 and before,
	// containerd 1.x set up so), under which Docker leaves no annotation.
	for _, runtime := range []string{"/io.containerd.runtime.v2.task/", "/io.containerd.runtime.v1.linux/"} {
		i := strings.Index(st.Bundle, runtime)
		if i < 0 {
			continue
		}
		ns, _, _ := strings.Cut(st.Bundle[i+len(runtime):], "/")
		if ns == "moby" {
			return "Docker", "docker checkpoint create " + st.ID + " NAME", true
		}
		return "containerd", fmt.Sprintf("ctr -n %s containers checkpoint --task %s IMAGE-REF", ns, st.ID), true
	}
	// podman and CRI-O keep bundles in containers/storage.
	if strings.Contains(st.Bundle, "/overlay-containers/") && strings.HasSuffix(st.Bundle, "/userdata") {
		return "podman or CRI-O", "podman container checkpoint " + st.ID + " (podman) or the kubelet's checkpoint API (CRI-O)", true
	}
	return "", "", false
}

// checkUnowned refuses a container an engine manages, with the command that works.
func checkUnowned(st State) error {
	name, command, ok := owner(st)
	if !ok {
		return nil
	}
	return fmt.Errorf("%w: %s manages %s, and a checkpoint behind its back would lose the container; "+
		"checkpoint it through %s: %s (with `gpucr install-runc-integration`, that moves its GPU state too)",
		ErrEngineOwned, name, st.ID, name, command)
}
