"""Build wmrl's images with no registry: buildah, a local Debian python base, docker-archive tarballs.

    python3 tests/images/images.py build [NAME ...]   # default operator sandbox trainer-cpu;
                                                      # prints NAME<TAB>REF<TAB>TARBALL per image
    python3 tests/images/images.py base               # the base image only; prints its ref
    python3 tests/images/images.py list               # what is cached

From Python (standard library only, so tests/cluster can load it by path)::

    from images import build_all
    tarballs = build_all()            # {"operator": Path(".../operator-<key>.tar"), ...}
    # each imports with `ctr -n k8s.io images import <tarball>` as image_keys.IMAGES[name].ref

Everything lives under ``${WMRL_CACHE:-~/.cache/wmrl}/images``: the tarballs and their
records (``<name>.json``), build logs, and buildah's storage and configuration (buildah runs
with ``--root``/``--runroot`` there and its own storage.conf, registries.conf and signature
policy, so the host's container configuration and /var/lib/containers/storage are not used).
Images are cached by :mod:`image_keys`; a rebuild reuses buildah's cache of the steps before
the first changed COPY (``--layers``), and what it supersedes is pruned from the storage.
docs/images.md has the design, the figures and the environment variables.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import image_keys  # noqa: E402  (found through HERE, also when this file is loaded by path)
from image_keys import BASE_REF, IMAGES, DEFAULT_NAMES, ImageSpec  # noqa: E402

BASE_CONTAINERFILE = HERE / "base" / "Containerfile"
DEBIAN_PACKAGES = ("buildah", "debootstrap")


# ---------------------------------------------------------------- configuration

def images_dir(cache_dir: Optional[os.PathLike] = None) -> Path:
    """Where tarballs, records, logs and builder state live."""
    root = Path(cache_dir) if cache_dir else Path(os.environ.get("WMRL_CACHE") or Path.home() / ".cache" / "wmrl")
    return root / "images"


def mirrors() -> tuple[str, str]:
    return (os.environ.get("WMRL_DEBIAN_MIRROR") or image_keys.DEFAULT_MIRROR,
            os.environ.get("WMRL_DEBIAN_SECURITY_MIRROR") or image_keys.DEFAULT_SECURITY_MIRROR)


def ca_bundle() -> Path:
    """The CA bundle pip trusts on this host, copied into the base so pip in the builds trusts it too."""
    path = Path(os.environ.get("WMRL_IMAGES_CA_BUNDLE") or os.environ.get("PIP_CERT")
                or "/etc/ssl/certs/ca-certificates.crt")
    if not path.is_file():
        raise RuntimeError(f"WMRL_IMAGES_CA_BUNDLE: no CA bundle at {path}")
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def context_files(spec: ImageSpec, repo: Path = REPO) -> dict[str, str]:
    """Every file the image's COPY/ADD instructions take from the repository: path -> SHA-256."""
    out: dict[str, str] = {}
    for src in image_keys.copy_sources((repo / spec.dockerfile).read_text()):
        top = repo / src
        if not top.exists():
            raise FileNotFoundError(f"{spec.dockerfile}: COPY source {src} does not exist")
        for path in sorted([top] if top.is_file() else (p for p in top.rglob("*") if p.is_file())):
            rel = path.relative_to(repo).as_posix()
            if not image_keys.is_ignored(rel):
                out[rel] = sha256_file(path)
    return out


# ---------------------------------------------------------------- tools

def ensure_tools(packages: Sequence[str] = DEBIAN_PACKAGES) -> None:
    """Install buildah and debootstrap from Debian when missing (as root, like `make test`)."""
    missing = [p for p in packages if not shutil.which(p)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"{', '.join(missing)} missing: run `apt-get install {' '.join(missing)}` as root")
    print(f"images: installing {' '.join(missing)} (apt)", file=sys.stderr, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # The lock tests/cluster/build takes too: make test builds the node and the images at once.
    with open(os.environ.get("WMRL_APT_LOCK", "/var/lock/wmrl-apt.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", "-o", "DPkg::Lock::Timeout=600", "--no-install-recommends",
                        *missing], check=True, env=env, stdout=sys.stderr)


@dataclass
class Buildah:
    """buildah with all of its state under ``state`` and chroot isolation on the host network.

    chroot isolation needs no OCI runtime, no cgroup manager and no network namespace, so it
    works on cgroup v1 without systemd and leaves /run/netns (containerd's) alone.
    """

    state: Path
    driver: str = ""

    def __post_init__(self) -> None:
        self.driver = self.driver or os.environ.get("WMRL_IMAGES_STORAGE_DRIVER") or "overlay"
        self.root = self.state / self.driver / "root"
        self.runroot = self.state / self.driver / "run"
        self.policy = self.state / "policy.json"
        self.registries = self.state / "registries.conf"
        self.storage_conf = self.state / "storage.conf"
        self.root.mkdir(parents=True, exist_ok=True)
        self.runroot.mkdir(parents=True, exist_ok=True)
        # Local images only: nothing is pulled, so any signature policy would do; this one does not
        # depend on the host's /etc/containers.
        self.policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}) + "\n")
        self.registries.write_text("unqualified-search-registries = []\n")
        self.storage_conf.write_text(f'[storage]\ndriver = "{self.driver}"\ngraphroot = "{self.root}"\n'
                                     f'runroot = "{self.runroot}"\n')

    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
                "CONTAINERS_REGISTRIES_CONF": str(self.registries), "BUILDAH_ISOLATION": "chroot"}

    def argv(self, *args: str) -> list[str]:
        return ["buildah", "--root", str(self.root), "--runroot", str(self.runroot), "--storage-driver", self.driver,
                *args]

    def __call__(self, *args: str, log: Optional[Path] = None, timeout: Optional[float] = None) -> str:
        """Run one buildah command; its stdout (or, with ``log``, its whole output appended there)."""
        if log is None:
            proc = subprocess.run(self.argv(*args), env=self.env(), capture_output=True, text=True, timeout=timeout)
            if proc.returncode:
                raise RuntimeError(f"buildah {args[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
            return proc.stdout
        with open(log, "a") as out:
            out.write(f"$ {' '.join(self.argv(*args))}\n")
            out.flush()
            proc = subprocess.run(self.argv(*args), env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        if proc.returncode:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"buildah {args[0]} failed ({proc.returncode}); log {log}:\n{tail}")
        return ""

    def image_id(self, ref: str) -> Optional[str]:
        """The image's ID (its config digest), or None when the storage lacks it."""
        proc = subprocess.run(self.argv("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref),
                              env=self.env(), capture_output=True, text=True)
        return (proc.stdout.strip() or None) if proc.returncode == 0 else None

    def bud(self, context: Path, containerfile: Path, ref: str, build_args: dict[str, str], log: Path) -> None:
        args = ["bud", "--pull=never", "--layers", "--isolation", "chroot", "--network", "host",
                "--signature-policy", str(self.policy), "-f", str(containerfile), "-t", ref]
        for key, value in build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        self(*args, str(context), log=log)

    def save(self, ref: str, tarball: Path, log: Path) -> None:
        """Write ``ref`` as a docker-archive tarball tagged ``ref`` (what `ctr images import` reads)."""
        tmp = tarball.with_name(tarball.name + ".tmp")
        tmp.unlink(missing_ok=True)
        self("push", "--signature-policy", str(self.policy), ref, f"docker-archive:{tmp}:{ref}", log=log)
        tmp.rename(tarball)

    def prune(self, passes: int = 10) -> None:
        """Remove what a rebuild superseded: untagged images that are no other image's parent.

        One pass removes the old leaf; its cached parent steps become leaves for the next pass,
        unless the new image still builds on them (``--layers``)."""
        for _ in range(passes):
            if not self("rmi", "--prune").strip():
                return

    def load(self, tarball: Path, log: Path) -> None:
        self("pull", "--signature-policy", str(self.policy), f"docker-archive:{tarball}", log=log)

    @contextlib.contextmanager
    def container(self, ref: str) -> Iterator[str]:
        """A working container of ``ref``, removed afterwards."""
        name = self("from", "--pull=never", "--signature-policy", str(self.policy), ref).strip().splitlines()[-1]
        try:
            yield name
        finally:
            subprocess.run(self.argv("rm", name), env=self.env(), capture_output=True)

    def run_in(self, ref: str, argv: Sequence[str], user: Optional[str] = None, files: Optional[dict[str, Path]] = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
        """Run ``argv`` in a fresh container of ``ref`` (as the image's USER unless ``user``); output captured.

        ``files`` maps container paths to host files copied in first.
        """
        with self.container(ref) as name:
            for dest, src in (files or {}).items():
                self("copy", "--chmod", "0644", name, str(src), dest)
            # localhost: in a Pod the hostname resolves (the kubelet writes /etc/hosts), and torch's
            # process group connects to it; buildah's /etc/hosts does not list a container's own name.
            args = ["run", "--isolation", "chroot", "--network", "host", "--hostname", "localhost"]
            if user:
                args += ["--user", user]
            return subprocess.run(self.argv(*args, name, "--", *argv), env=self.env(), capture_output=True,
                                  text=True, timeout=timeout)


# ---------------------------------------------------------------- records and locking

@dataclass
class Built:
    name: str
    ref: str
    key: str
    tarball: Path
    image_id: str
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "tarball": str(self.tarball), "bytes": self.tarball.stat().st_size},
                          indent=1) + "\n"


def read_record(directory: Path, name: str) -> Optional[Built]:
    try:
        data = json.loads((directory / f"{name}.json").read_text())
        built = Built(data["name"], data["ref"], data["key"], Path(data["tarball"]), data["image_id"],
                      data.get("seconds", 0.0))
    except (OSError, ValueError, KeyError):
        return None
    return built if built.tarball.is_file() else None


def write_record(directory: Path, built: Built) -> None:
    tmp = directory / f".{built.name}.json.tmp"
    tmp.write_text(built.to_json())
    tmp.rename(directory / f"{built.name}.json")
    for old in directory.glob(f"{built.name}-*.tar"):
        if old != built.tarball:
            old.unlink()  # an earlier key's tarball: superseded


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """One build at a time per cache (make images and a test fixture may start together)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _say(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the base

def _debootstrap(rootfs: Path, mirror: str, log: Path) -> None:
    with open(log, "a") as out:
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(image_keys.BASE_PACKAGES)}",
                        image_keys.BASE_SUITE, str(rootfs), mirror], check=True, stdout=out, stderr=subprocess.STDOUT)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / junk).glob("*"):
            if path.is_file():
                path.unlink()


def _base_key() -> str:
    mirror, security = mirrors()
    return image_keys.base_key(BASE_CONTAINERFILE.read_text(), image_keys.BASE_SUITE, mirror, security,
                               image_keys.BASE_PACKAGES, sha256_file(ca_bundle()))


def ensure_base(buildah: Buildah, directory: Path) -> Built:
    """The local python base: reused when its record matches the key, reloaded from its tarball
    when the storage lost it, else built (debootstrap, then base/Containerfile)."""
    key = _base_key()
    record = read_record(directory, "base")
    if record and record.key == key:
        if buildah.image_id(record.ref) != record.image_id:
            _say(f"loading {record.tarball.name} into the builder's storage")
            buildah.load(record.tarball, directory / "logs" / "base.log")
        return record
    logs = directory / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "base.log"
    log.write_text("")
    mirror, security = mirrors()
    started = time.monotonic()
    (directory / "tmp").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory / "tmp", prefix="base-") as tmp:
        work = Path(tmp)
        _say(f"debootstrap {image_keys.BASE_SUITE} from {mirror} (log {log})")
        _debootstrap(work / "rootfs", mirror, log)
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(work / "rootfs"), "-cf",
                        str(work / "rootfs.tar"), "."], check=True)
        shutil.rmtree(work / "rootfs")
        shutil.copyfile(ca_bundle(), work / "ca-bundle.crt")
        shutil.copyfile(BASE_CONTAINERFILE, work / "Containerfile")
        _say(f"building {BASE_REF}")
        buildah.bud(work, work / "Containerfile", BASE_REF, {"MIRROR": mirror, "SECURITY_MIRROR": security}, log)
    tarball = directory / f"base-{key[:16]}.tar"
    buildah.save(BASE_REF, tarball, log)
    built = Built("base", BASE_REF, key, tarball, buildah.image_id(BASE_REF) or "", time.monotonic() - started)
    write_record(directory, built)
    buildah.prune()
    _say(f"base built in {built.seconds:.0f} s")
    return built


# ---------------------------------------------------------------- the images

def image_key(spec: ImageSpec, base: Built, repo: Path = REPO) -> str:
    return image_keys.image_key(spec, (repo / spec.dockerfile).read_text(), context_files(spec, repo), base.image_id)


# What a full build of each image needs free under the images directory, measured with some margin:
# pip's downloads and the unpacked wheels, the new layers, then the docker-archive tarball.
BUILD_SPACE_GIB = {"trainer": 30, "trainer-cpu": 16}
DEFAULT_BUILD_SPACE_GIB = 3


def check_free_space(directory: Path, name: str) -> None:
    """Refuse to start a build that would fill the disk halfway (pip's ENOSPC says nothing of why)."""
    need = BUILD_SPACE_GIB.get(name, DEFAULT_BUILD_SPACE_GIB)
    free = shutil.disk_usage(directory).free / 2**30
    if free < need:
        raise RuntimeError(f"images: {free:.1f} GiB free under {directory}; building {name} needs about {need} GiB "
                           f"(downloads, layers and the tarball). Free some space or point WMRL_CACHE elsewhere.")


def ensure_image(buildah: Buildah, spec: ImageSpec, base: Built, directory: Path, repo: Path = REPO) -> Built:
    key = image_key(spec, base, repo)
    record = read_record(directory, spec.name)
    if record and record.key == key:
        return record
    log = directory / "logs" / f"{spec.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    for old in directory.glob(f"{spec.name}-*.tar"):
        old.unlink()  # an earlier key's tarball, superseded whatever the build's outcome: its space first
    check_free_space(directory, spec.name)
    _say(f"building {spec.ref} from {spec.dockerfile} (log {log})")
    started = time.monotonic()
    buildah.bud(repo, repo / spec.dockerfile, spec.ref, {spec.base_arg: base.ref, **spec.build_args}, log)
    tarball = directory / f"{spec.name}-{key[:16]}.tar"
    buildah.save(spec.ref, tarball, log)
    built = Built(spec.name, spec.ref, key, tarball, buildah.image_id(spec.ref) or "", time.monotonic() - started)
    write_record(directory, built)
    buildah.prune()
    _say(f"{spec.name} built in {built.seconds:.0f} s: {tarball} ({tarball.stat().st_size / 2**20:.0f} MiB)")
    return built


def builder(cache_dir: Optional[os.PathLike] = None) -> Buildah:
    return Buildah(images_dir(cache_dir) / "buildah")


def build(names: Iterable[str] = DEFAULT_NAMES, cache_dir: Optional[os.PathLike] = None) -> dict[str, Built]:
    """Build (or reuse) the base and the named images; their records by name."""
    specs = image_keys.select(names)
    directory = images_dir(cache_dir)
    with locked(directory):
        ensure_tools()
        buildah = builder(cache_dir)
        base = ensure_base(buildah, directory)
        return {spec.name: ensure_image(buildah, spec, base, directory) for spec in specs}


def build_all(cache_dir: Optional[os.PathLike] = None, names: Iterable[str] = DEFAULT_NAMES) -> dict[str, Path]:
    """name -> docker-archive tarball, importable with `ctr -n k8s.io images import` as IMAGES[name].ref."""
    return {name: built.tarball for name, built in build(names, cache_dir).items()}


def ensure_loaded(name: str, cache_dir: Optional[os.PathLike] = None) -> Built:
    """The built image ``name`` present in the builder's storage (reloaded from its tarball if need be)."""
    directory = images_dir(cache_dir)
    built = build([name], cache_dir)[name] if name != "base" else None
    with locked(directory):
        buildah = builder(cache_dir)
        if built is None:
            return ensure_base(buildah, directory)
        if buildah.image_id(built.ref) != built.image_id:
            buildah.load(built.tarball, directory / "logs" / f"{name}.log")
    return built


# ---------------------------------------------------------------- CLI

def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="images.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build or reuse images; prints NAME, REF and TARBALL per line")
    b.add_argument("names", nargs="*", default=list(DEFAULT_NAMES), help=f"of {', '.join(IMAGES)} "
                   f"(default {' '.join(DEFAULT_NAMES)})")
    sub.add_parser("base", help="build or reuse the local python base; prints its ref")
    sub.add_parser("list", help="the cached images")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for name, built in build(args.names).items():
                print(f"{name}\t{built.ref}\t{built.tarball}")
        elif args.command == "base":
            directory = images_dir()
            with locked(directory):
                ensure_tools()
                print(ensure_base(builder(), directory).ref)
        else:
            for name in ("base", *IMAGES):
                record = read_record(images_dir(), name)
                if record:
                    print(f"{name}\t{record.ref}\t{record.tarball}\t{record.tarball.stat().st_size / 2**20:.0f} MiB\t"
                          f"built in {record.seconds:.0f} s")
    except (RuntimeError, ValueError, OSError, subprocess.CalledProcessError) as exc:
        print(f"images.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
