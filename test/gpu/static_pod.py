"""The kubelet's side of engines_plan.sh's kube part.

Usage: static_pod.py NAME IMAGE X BINDS MOUNT... -- ENV... -- COMMAND...
  prints a static pod manifest (JSON, which the kubelet reads as it reads YAML): pod NAME,
  one container "work" of IMAGE (never pulled) running COMMAND on the host network, asking
  for one nvidia.com/gpu (the device plugin gives it that GPU's device nodes: it is not
  privileged), /x bound to the host directory X, and each MOUNT read-only from BINDS/MOUNT.
Usage: static_pod.py --post URL
  POSTs to the kubelet's URL (its own self-signed certificate, anonymous access) and prints
  the answer: the checkpoint endpoint's {"items": [ARCHIVE]}; exit 1 and the status on an
  HTTP error.
"""
import json, ssl, sys, urllib.error, urllib.request


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


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "--post":
        post(a[1])
    else:
        first = a.index("--")
        second = a.index("--", first + 1)
        print(json.dumps(manifest(a[0], a[1], a[2], a[3], a[4:first], a[first + 1:second], a[second + 1:])))
