"""The kubelet's and the CRI's side of engines_plan.sh's kube part.

Usage: static_pod.py NAME IMAGE X BINDS MOUNT... -- ENV... -- COMMAND...
  prints a static pod manifest (JSON, which the kubelet reads as it reads YAML): pod NAME,
  one container "work" of IMAGE (never pulled) running COMMAND on the host network, asking
  for one nvidia.com/gpu (the device plugin gives it that GPU's device nodes: it is not
  privileged), /x bound to the host directory X, and each MOUNT read-only from BINDS/MOUNT.
Usage: static_pod.py --cri-sandbox NAME LOGDIR
  prints the CRI PodSandboxConfig (crictl runp) of pod NAME on the host network, with the
  namespaces the kubelet gives such a pod, its container logs under LOGDIR.
Usage: static_pod.py --cri-container DEVICE,... IMAGE X BINDS MOUNT... -- ENV... -- COMMAND...
  prints the CRI ContainerConfig (crictl create) of the same container "work" as a static
  pod's: IMAGE may be a checkpoint archive; the GPU is the device nodes DEVICE (host paths,
  each at /dev/BASENAME in the container), what the kubelet hands the runtime from a device
  plugin's Allocate or CDI. It carries an annotation as the kubelet's containers do:
  containerd 2.2.x panics restoring a checkpoint of a container that had none (its
  CRImportCheckpoint writes into the checkpointed container's nil annotation map;
  containerd/containerd#12763, fixed in 2.3.0).
Usage: static_pod.py --post URL
  POSTs to the kubelet's URL (its own self-signed certificate, anonymous access) and prints
  the answer: the checkpoint endpoint's {"items": [ARCHIVE]}; exit 1 and the status on an
  HTTP error.
"""
import json, os, ssl, sys, urllib.error, urllib.request

# The CRI's NamespaceMode: the kubelet's choice for a pod on the host network without
# hostPID or shareProcessNamespace.
POD, CONTAINER, NODE = 0, 1, 2
NAMESPACES = {"network": NODE, "pid": CONTAINER, "ipc": POD}


def manifest(name, image, x, binds, mounts, envs, command):
    vols = [{"name": "x", "hostPath": {"path": x}}]
    vols += [{"name": f"b{i}", "hostPath": {"path": binds + m}} for i, m in enumerate(mounts)]
    vm = [{"name": "x", "mountPath": "/x"}]
    vm += [{"name": f"b{i}", "mountPath": m, "readOnly": True} for i, m in enumerate(mounts)]
    env = [dict(zip(("name", "value"), e.split("=", 1))) for e in envs]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"hostNetwork": True, "restartPolicy": "Never", "volumes": vols, "containers": [{
                "name": "work", "image": image, "imagePullPolicy": "Never", "command": command,
                "workingDir": "/x", "env": env, "resources": {"limits": {"nvidia.com/gpu": 1}},
                "volumeMounts": vm}]}}


def cri_sandbox(name, logdir):
    return {"metadata": {"name": name, "namespace": "default", "uid": f"{name}-uid", "attempt": 0},
            "log_directory": logdir,
            "linux": {"security_context": {"namespace_options": NAMESPACES}}}


def cri_container(devices, image, x, binds, mounts, envs, command):
    return {"metadata": {"name": "work", "attempt": 0}, "image": {"image": image},
            "command": command, "working_dir": "/x", "log_path": "work.log",
            "annotations": {"io.kubernetes.container.restartCount": "0"},
            "envs": [dict(zip(("key", "value"), e.split("=", 1))) for e in envs],
            "mounts": [{"container_path": "/x", "host_path": x}] +
                      [{"container_path": m, "host_path": binds + m, "readonly": True} for m in mounts],
            "devices": [{"container_path": "/dev/" + os.path.basename(d), "host_path": d, "permissions": "rw"}
                        for d in devices.split(",") if d],
            "linux": {"security_context": {"namespace_options": NAMESPACES}}}


def post(url):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), context=ctx, timeout=600) as r:
            print(r.read().decode())
    except urllib.error.HTTPError as e:
        print(f"HTTP {e.code}: {e.read().decode().strip()}")
        sys.exit(1)


def container_args(a):
    """FIRST IMAGE X BINDS MOUNT... -- ENV... -- COMMAND..., as the arguments of manifest()."""
    first = a.index("--")
    second = a.index("--", first + 1)
    return a[0], a[1], a[2], a[3], a[4:first], a[first + 1:second], a[second + 1:]


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "--post":
        post(a[1])
    elif a[0] == "--cri-sandbox":
        print(json.dumps(cri_sandbox(a[1], a[2])))
    elif a[0] == "--cri-container":
        print(json.dumps(cri_container(*container_args(a[1:]))))
    else:
        print(json.dumps(manifest(*container_args(a))))
