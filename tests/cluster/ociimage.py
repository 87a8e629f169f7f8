"""Pack files into a single-layer OCI image archive that ``ctr images import`` accepts.

No registry is reachable here, so the real node's images (the Pod sandbox's pause image, the
tests' helper) are made from static binaries built in this repository. Standard library only::

    python3 tests/cluster/ociimage.py --name wmrl.local/pause:1 --entrypoint /pause \\
        --file /pause=./pause -o pause.oci.tar

The archive is reproducible: the same files give the same bytes (fixed mtimes and owners).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import sys
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"

# a full reference with a registry host, e.g. wmrl.local/pause:abc (the CRI does not rewrite
# those, unlike "pause" -> docker.io/library/pause:latest)
_REF = re.compile(r"^[a-z0-9.-]+\.[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)+:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def _json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def layer(files: Dict[str, bytes]) -> bytes:
    """An uncompressed layer tar: the files (executable), their parent directories, and the
    /etc, /tmp and /dev directories the runtime mounts files into."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = {"etc", "dev", "proc", "sys"}
        for path in files:
            parts = path.strip("/").split("/")[:-1]
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        for d in sorted(dirs):
            _add_dir(tar, d)
        _add_dir(tar, "tmp", 0o1777)
        for path, data in sorted(files.items()):
            _add(tar, path.strip("/"), data, 0o755)
    return buf.getvalue()


def archive(ref: str, entrypoint: Sequence[str], files: Dict[str, bytes],
            env: Sequence[str] = ("PATH=/",)) -> bytes:
    """The OCI image layout (oci-layout, index.json, blobs) of a one-layer linux/amd64 image,
    as a tar, named ``ref`` for containerd (io.containerd.image.name)."""
    if not _REF.match(ref):
        raise ValueError(f"--name {ref!r}: want a full reference like wmrl.local/name:tag")
    if not files:
        raise ValueError("--file: at least one file is needed")
    lay = layer(files)
    config = _json({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "Env": list(env), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(lay)]},
        "history": [{"created_by": "tests/cluster/ociimage.py"}],
    })
    manifest = _json({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": _digest(lay), "size": len(lay)}],
    })
    index = _json({
        "schemaVersion": 2, "mediaType": INDEX_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_TYPE, "digest": _digest(manifest), "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
        }],
    })
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add(tar, "index.json", index)
        for blob in (config, manifest, lay):
            _add(tar, "blobs/sha256/" + _digest(blob).split(":", 1)[1], blob)
    return buf.getvalue()


def _parse_file(spec: str) -> Tuple[str, Path]:
    dest, sep, src = spec.partition("=")
    if not sep or not dest.startswith("/") or not src:
        raise ValueError(f"--file {spec!r}: want /path/in/image=local-file")
    return dest, Path(src)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True, help="image reference, e.g. wmrl.local/pause:1")
    ap.add_argument("--entrypoint", required=True, action="append",
                    help="entrypoint (repeat for arguments)")
    ap.add_argument("--file", action="append", default=[], help="/path/in/image=local-file")
    ap.add_argument("-o", "--output", required=True, type=Path)
    a = ap.parse_args(argv)
    try:
        files = {dest: src.read_bytes() for dest, src in map(_parse_file, a.file)}
        data = archive(a.name, a.entrypoint, files)
    except (ValueError, OSError) as e:
        print(f"ociimage: {e}", file=sys.stderr)
        return 2
    a.output.write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
