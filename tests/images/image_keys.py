"""What each wmrl image is built from, and the cache keys that say when it must be rebuilt.

Pure functions and data only (no subprocess, no builder): ``images.py`` acts on them.
Standard library only, so that tests/cluster and a bare ``python3`` can import it.

An image's key is a SHA-256 over everything that decides its content and that this
repository controls: the Dockerfile, every file its COPY/ADD instructions bring in (path and
content), the build arguments, the base image's ID and the reference it is tagged with. What
pip and apt resolve at build time is not in the key: a cached image keeps the versions it was
built with until one of its inputs changes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Iterable, Mapping, Sequence

# Bumped when the way images are built changes in a way the inputs below do not show.
RECIPE_VERSION = "1"

# Files never copied into an image (.dockerignore excludes them from the build context too;
# tests/images/test_image_keys.py keeps the two lists in step).
IGNORED_NAMES = ("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".pytest_cache", ".hypothesis")

# The local stand-in for python:3.11-slim (see base/Containerfile): Debian's own packages.
BASE_REF = "localhost/wmrl/python:3.11-bookworm"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"

# The CUDA wheels that `import torch` (the PyPI build) never loads, so a CPU image can drop
# them: torch._C links libtorch_cuda.so, which needs cudart, cuBLAS, cuDNN, cuFFT, cuFile,
# cuSPARSE(Lt), NCCL, NVRTC, NVSHMEM and CUPTI, but neither Triton (997 MiB) nor cuSOLVER
# (264 MiB, loaded with torch.linalg on a GPU), NVTX or the CUDA Python bindings (docs/images.md).
CPU_TRAINER_PRUNE = ("triton", "cuda-bindings", "cuda-pathfinder", "nvidia-cusolver", "nvidia-nvtx")


@dataclass(frozen=True)
class ImageSpec:
    """One image this repository builds: which Dockerfile, with which arguments, tagged how."""

    name: str
    dockerfile: str                      # relative to the repository root (the build context)
    ref: str                             # the name the CRI sees after `ctr images import`
    base_arg: str                        # the build argument that names the base image
    build_args: Mapping[str, str] = field(default_factory=dict)


# Tags are `dev`: locally built, never to be confused with a published release.
IMAGES: dict[str, ImageSpec] = {
    "operator": ImageSpec("operator", "operator/Dockerfile", "docker.io/wmrl/operator:dev", "PYTHON_IMAGE"),
    "sandbox": ImageSpec("sandbox", "sandbox-image/Dockerfile", "docker.io/wmrl/sandbox:dev", "PYTHON_IMAGE"),
    "trainer-cpu": ImageSpec("trainer-cpu", "trainer/Dockerfile", "docker.io/wmrl/trainer:dev-cpu", "BASE_IMAGE",
                             {"EXTRAS": "train", "PRUNE": " ".join(CPU_TRAINER_PRUNE)}),
    # The published trainer's recipe (train + gpu extras: torch with its CUDA wheels, vLLM) on the local base.
    "trainer": ImageSpec("trainer", "trainer/Dockerfile", "docker.io/wmrl/trainer:dev", "BASE_IMAGE"),
}
# What a cluster test needs: the GPU trainer is ~7 GB and has no GPU to run on here.
DEFAULT_NAMES = ("operator", "sandbox", "trainer-cpu")


def select(names: Iterable[str]) -> list[ImageSpec]:
    """The specs for ``names``, in order; ValueError naming an unknown one."""
    out = []
    for name in names:
        if name not in IMAGES:
            raise ValueError(f"unknown image {name!r}; known: {', '.join(IMAGES)}")
        out.append(IMAGES[name])
    return out


def instructions(dockerfile_text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuation lines joined, comments and blank lines dropped."""
    out, buf = [], ""
    for line in dockerfile_text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        stripped = line.rstrip()
        buf += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    if buf.strip():
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def copy_sources(dockerfile_text: str) -> list[str]:
    """The build-context paths that COPY/ADD bring into the image, in order, without repeats.

    COPY --from=<stage> copies from another image, not the context, so it is left out; so is an
    ADD of a URL. Both the shell form (``COPY a b dest``) and the JSON form are understood.
    """
    sources: list[str] = []
    for word, args in instructions(dockerfile_text):
        if word not in ("COPY", "ADD"):
            continue
        if args.startswith("["):
            try:
                parts = json.loads(args)
            except ValueError as exc:
                raise ValueError(f"{word} {args}: not a JSON array: {exc}") from None
        else:
            parts = shlex.split(args)
        flags = [p for p in parts if p.startswith("--")]
        paths = [p for p in parts if not p.startswith("--")]
        if any(f.startswith("--from=") for f in flags):
            continue
        if len(paths) < 2:
            raise ValueError(f"{word} {args}: needs a source and a destination")
        for src in paths[:-1]:
            if "://" in src:
                continue
            src = str(PurePosixPath(src))
            if src.startswith("/") or ".." in PurePosixPath(src).parts:
                raise ValueError(f"{word} {args}: source {src!r} is outside the build context")
            if src not in sources:
                sources.append(src)
    return sources


def is_ignored(relpath: str) -> bool:
    """True when a context path (or a folder above it) matches IGNORED_NAMES."""
    return any(fnmatch.fnmatch(part, pattern) for part in PurePosixPath(relpath).parts for pattern in IGNORED_NAMES)


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def image_key(spec: ImageSpec, dockerfile_text: str, files: Mapping[str, str], base_id: str) -> str:
    """The cache key of one image.

    ``files`` maps each copied context path (POSIX, relative) to the SHA-256 of its content;
    ``base_id`` is the ID (config digest) of the base image it is built FROM.
    """
    if not base_id:
        raise ValueError("base_id: the base image's ID is needed for the key")
    return _digest({"recipe": RECIPE_VERSION, "ref": spec.ref, "dockerfile": dockerfile_text,
                    "build_args": dict(spec.build_args), "base_arg": spec.base_arg, "base_id": base_id,
                    "files": dict(files)})


def base_key(containerfile_text: str, suite: str, mirror: str, security_mirror: str, packages: Sequence[str],
             ca_bundle_sha256: str) -> str:
    """The cache key of the local Debian python base image."""
    return _digest({"recipe": RECIPE_VERSION, "containerfile": containerfile_text, "suite": suite,
                    "mirror": mirror.rstrip("/"), "security_mirror": security_mirror.rstrip("/"),
                    "packages": sorted(packages), "ca_bundle": ca_bundle_sha256})
