"""An OCI image archive of one uncompressed layer, for the GPU container plans.

Usage: oci_archive.py OUT NAME (--dir ROOT | --layer TAR) [--entrypoint ARG]... [--annotation K=V]...
Writes OUT, an OCI image layout as a tar (what podman load and ctr images import read),
holding one image named NAME whose layer is the directory ROOT, or the tar file TAR as it
is (a checkpoint archive: a checkpoint image is that archive as a layer, with the annotation
org.criu.checkpoint.container.name on its manifest, which is what containerd's CRI plugin
looks for before restoring from an image). Annotations go on the manifest.
"""
import argparse, hashlib, io, json, os, tarfile, tempfile


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("name")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--dir")
    src.add_argument("--layer")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--annotation", action="append", default=[])
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.out))) as tmp:
        layer = a.layer
        if a.dir:
            layer = os.path.join(tmp, "layer.tar")
            with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as t:
                t.add(a.dir, arcname=".")
        layer_digest, layer_size = sha256_file(layer), os.path.getsize(layer)
        blobs = {}

        def blob(data):
            d = hashlib.sha256(data).hexdigest()
            blobs[d] = data
            return "sha256:" + d

        config = {"architecture": "amd64", "os": "linux", "config": {},
                  "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_digest]}}
        if a.entrypoint:
            config["config"]["Entrypoint"] = a.entrypoint
        cfg = json.dumps(config).encode()
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(cfg), "size": len(cfg)},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                "digest": "sha256:" + layer_digest, "size": layer_size}]}
        if a.annotation:
            manifest["annotations"] = dict(kv.split("=", 1) for kv in a.annotation)
        man = json.dumps(manifest).encode()
        index = json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": blob(man), "size": len(man),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"org.opencontainers.image.ref.name": a.name}}]}).encode()
        with tarfile.open(a.out, "w") as t:
            for name, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index),
                               *((f"blobs/sha256/{d}", b) for d, b in blobs.items())]:
                i = tarfile.TarInfo(name)
                i.size = len(data)
                t.addfile(i, io.BytesIO(data))
            t.add(layer, arcname=f"blobs/sha256/{layer_digest}")


if __name__ == "__main__":
    main()
