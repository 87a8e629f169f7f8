"""A real Kubernetes control plane for wmrl tests.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler, with kwok
simulating kubelets on four fake nodes, and on request one real node
(``start_real_node()``, ``up --real-node``: containerd, runc, the kubelet,
kube-proxy and CoreDNS on this machine).  All binaries are built from source by
``tests/cluster/build`` and cached by version under
``${WMRL_CACHE:-~/.cache/wmrl}/bin/<name>-<version>/<name>``.

Standard library only, so it runs with a bare ``python3``:

    python3 tests/cluster/cluster.py up      # last stdout line: kubeconfig path
    python3 tests/cluster/cluster.py down
    python3 tests/cluster/cluster.py status

From Python::

    from cluster import up, down, kubectl, helm, binary
    c = up()
    kubectl("get", "nodes", kubeconfig=c.kubeconfig)

State (pids, logs, certs, etcd data) lives in
``${WMRL_CLUSTER_DIR:-$WMRL_CACHE/cluster}``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build"


def _sibling(name: str):
    """tests/cluster/<name>.py, loaded by path as wmrl_<name> (as tests/conftest.py loads this
    module), so that it does not depend on sys.path."""
    mod = f"wmrl_{name}"
    if mod not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod, HERE / f"{name}.py")
        sys.modules[mod] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[mod])
    return sys.modules[mod]


nodeconfig = _sibling("nodeconfig")
hoststate = _sibling("hoststate")

# --------------------------------------------------------------------------
# versions: the build script is the single source of truth (its defaults can
# be overridden with WMRL_K8S_VERSION etc., which both honour).

_VERSION_VARS = {
    "k8s": "K8S_VERSION",
    "etcd": "ETCD_VERSION",
    "kwok": "KWOK_VERSION",
    "helm": "HELM_VERSION",
    "kueue": "KUEUE_VERSION",
    "coredns": "COREDNS_VERSION",
    "containerd": "CONTAINERD_VERSION",
    "runc": "RUNC_VERSION",
}


def versions() -> Dict[str, str]:
    text = BUILD_SCRIPT.read_text()
    out = {}
    for key, var in _VERSION_VARS.items():
        m = re.search(r'^%s="\$\{(WMRL_\w+):-([^}]+)\}"' % var, text, re.M)
        if not m:
            raise RuntimeError(f"cannot find {var} in {BUILD_SCRIPT}")
        out[key] = os.environ.get(m.group(1)) or m.group(2)
    return out


_BINARY_GROUP = {
    "etcd": "etcd",
    "kube-apiserver": "k8s",
    "kube-controller-manager": "k8s",
    "kube-scheduler": "k8s",
    "kubectl": "k8s",
    "kwok": "kwok",
    "helm": "helm",
    "kueue": "kueue",
}
# the real node's (built by `build node`)
_NODE_BINARY_GROUP = {
    "kubelet": "k8s",
    "kube-proxy": "k8s",
    "coredns": "coredns",
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
}
# images built from this repository's sources (tests/cluster/images), versioned by a hash of
# the sources and of the packer, as `build` does
OWN_IMAGES = {"pause": "images/pause.c", "nodetool": "images/nodetool.go"}


def cache_dir() -> Path:
    return Path(os.environ.get("WMRL_CACHE") or Path.home() / ".cache" / "wmrl")


def default_state_dir() -> Path:
    return Path(os.environ.get("WMRL_CLUSTER_DIR") or cache_dir() / "cluster")


def binary(name: str) -> Path:
    """Path of a cached binary (etcd, kube-*, kubectl, kwok, helm, kueue, and the real node's
    kubelet, kube-proxy, coredns, containerd, containerd-shim-runc-v2, ctr, runc)."""
    group = _BINARY_GROUP.get(name) or _NODE_BINARY_GROUP.get(name)
    if group is None:
        raise KeyError(f"unknown binary {name!r}; known: "
                       f"{sorted([*_BINARY_GROUP, *_NODE_BINARY_GROUP])}")
    return cache_dir() / "bin" / f"{name}-{versions()[group]}" / name


def binaries(group: str = "control-plane") -> Dict[str, Path]:
    """The cached binaries of a build group: "control-plane" or "node"."""
    names = {"control-plane": _BINARY_GROUP, "node": _NODE_BINARY_GROUP}[group]
    return {n: binary(n) for n in names}


def own_image(name: str) -> Tuple[str, Path]:
    """(reference, OCI archive) of an image built from this repository: "pause" (the Pod
    sandbox) or "nodetool" (the tests' helper: serve, get, lookup, cat, echo, sleep)."""
    src = HERE / OWN_IMAGES[name]
    ver = hashlib.sha256(src.read_bytes() + (HERE / "ociimage.py").read_bytes()).hexdigest()[:12]
    return f"wmrl.local/{name}:{ver}", cache_dir() / "bin" / f"{name}-{ver}" / f"{name}.oci.tar"


def _built(group: str) -> bool:
    files = list(binaries(group).values())
    if group == "node":
        files += [own_image(n)[1] for n in OWN_IMAGES]
    return all(p.is_file() and (p.suffix == ".tar" or os.access(p, os.X_OK)) for p in files)


def build(groups: Sequence[str] = ("control-plane", "node")) -> None:
    """Build the missing binaries of the groups ("control-plane", "node") (no-op when they
    are cached, or when WMRL_NO_BUILD=1, e.g. when the build runs elsewhere)."""
    if os.environ.get("WMRL_NO_BUILD") == "1":
        return
    missing = [g for g in groups if not _built(g)]
    if not missing:
        return
    # The build script logs to stderr; keep our stdout clean.
    subprocess.run([str(BUILD_SCRIPT), *missing], check=True, stdout=sys.stderr)


# --------------------------------------------------------------------------
# ports (non-default so they do not clash with a real cluster); shift them all
# with WMRL_CLUSTER_PORT_OFFSET to run a second cluster side by side.

def _ports() -> Dict[str, int]:
    off = int(os.environ.get("WMRL_CLUSTER_PORT_OFFSET", "0"))
    base = {
        "etcd_client": 12379,
        "etcd_peer": 12380,
        "apiserver": 16443,
        "controller_manager": 16257,
        "scheduler": 16259,
        "kwok": 16247,
    }
    return {k: v + off for k, v in base.items()}


SERVICE_CIDR = "10.96.0.0/16"
SERVICE_FIRST_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/16"

COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]

NODES = [
    # name, cpu, memory, gpus
    ("kwok-cpu-0", "16", "64Gi", None),
    ("kwok-cpu-1", "16", "64Gi", None),
    ("kwok-gpu-0", "64", "512Gi", "8"),
    ("kwok-gpu-1", "64", "512Gi", "8"),
]


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# client helpers


def kubectl(*args: str, kubeconfig: Optional[os.PathLike] = None, check: bool = True,
            input: Optional[str] = None, timeout: float = 120,
            capture: bool = True) -> subprocess.CompletedProcess:
    """Run the cached kubectl.  Defaults to the admin kubeconfig of the
    default state dir.  Returns CompletedProcess (text mode)."""
    kc = str(kubeconfig or default_state_dir() / "admin.kubeconfig")
    cmd = [str(binary("kubectl")), "--kubeconfig", kc, *map(str, args)]
    res = subprocess.run(cmd, input=input, text=True, timeout=timeout,
                         stdout=subprocess.PIPE if capture else None,
                         stderr=subprocess.PIPE if capture else None)
    if check and res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr)
    return res


def helm(*args: str, kubeconfig: Optional[os.PathLike] = None, check: bool = True,
         input: Optional[str] = None, timeout: float = 300,
         capture: bool = True) -> subprocess.CompletedProcess:
    """Run the cached helm against the cluster (KUBECONFIG set in its env;
    helm's cache/config/data dirs are kept under the state dir)."""
    sd = default_state_dir()
    kc = str(kubeconfig or sd / "admin.kubeconfig")
    env = dict(os.environ)
    env["KUBECONFIG"] = kc
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"),
                     ("HELM_DATA_HOME", "data")):
        env.setdefault(var, str(sd / "helm" / sub))
    cmd = [str(binary("helm")), *map(str, args)]
    res = subprocess.run(cmd, input=input, text=True, timeout=timeout, env=env,
                         stdout=subprocess.PIPE if capture else None,
                         stderr=subprocess.PIPE if capture else None)
    if check and res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr)
    return res


@dataclass
class Cluster:
    state_dir: Path
    kubeconfig: Path
    server: str
    versions: Dict[str, str] = field(default_factory=dict)
    started: bool = False  # True if this up() call started the processes

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("kubeconfig", self.kubeconfig)
        return kubectl(*args, **kw)

    def helm(self, *args: str, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("kubeconfig", self.kubeconfig)
        return helm(*args, **kw)

    def binary(self, name: str) -> Path:
        return binary(name)

    def down(self) -> None:
        down(self.state_dir)


# --------------------------------------------------------------------------
# state layout


class _Paths:
    def __init__(self, state_dir: Path):
        self.root = state_dir
        self.pki = state_dir / "pki"
        self.logs = state_dir / "logs"
        self.pids = state_dir / "pids"
        self.etcd_data = state_dir / "etcd-data"
        self.kwok_config = state_dir / "kwok.yaml"
        self.nodes = state_dir / "nodes.yaml"
        self.admin_kubeconfig = state_dir / "admin.kubeconfig"
        self.lock = state_dir / ".lock"
        self.holders = state_dir / "holders"
        self.ephemeral = state_dir / "ephemeral"

    def kubeconfig(self, user: str) -> Path:
        return self.root / f"{user}.kubeconfig"

    def pidfile(self, comp: str) -> Path:
        return self.pids / f"{comp}.pid"


@contextlib.contextmanager
def _locked(paths: _Paths):
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------
# PKI (openssl)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _host_ip() -> str:
    """A non-loopback address to advertise (the apiserver refuses to publish
    a loopback address in the kubernetes Service endpoints)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
            if not ip.startswith("127."):
                return ip
    except OSError:
        pass
    return "127.0.0.1"


def _gen_cert(pki: Path, name: str, subj: str, ext: str) -> None:
    key, crt = pki / f"{name}.key", pki / f"{name}.crt"
    if key.exists() and crt.exists():
        return
    (pki / f"{name}.ext").write_text(ext)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key.tmp", "-out", f"{name}.csr", "-subj", subj, cwd=pki)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.crt.tmp", cwd=pki)
    os.replace(pki / f"{name}.key.tmp", key)
    os.replace(pki / f"{name}.crt.tmp", crt)


CLIENTS = {
    # kubeconfig user: certificate subject
    "admin": "/O=system:masters/CN=wmrl-admin",
    "controller-manager": "/CN=system:kube-controller-manager",
    "scheduler": "/CN=system:kube-scheduler",
    "kwok": "/O=system:masters/CN=wmrl-kwok",
    # the real node's (tests/cluster/README.md, "Real node")
    "kubelet": f"/O=system:nodes/CN=system:node:{nodeconfig.NODE_NAME}",
    "kube-proxy": "/CN=system:kube-proxy",  # bound to system:node-proxier by the apiserver
    "coredns": f"/CN={nodeconfig.COREDNS_USER}",
    # the apiserver's client cert towards kubelets (logs, exec, port-forward)
    "apiserver-kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client",
}


def _ensure_pki(p: _Paths) -> None:
    pki = p.pki
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        log("generating CA")
        _openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec",
                 "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", "ca.key.tmp",
                 "-out", "ca.crt.tmp", "-subj", "/CN=wmrl-test-ca", "-days", "3650", cwd=pki)
        os.replace(pki / "ca.key.tmp", pki / "ca.key")
        os.replace(pki / "ca.crt.tmp", pki / "ca.crt")
    sans = ",".join([
        "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local",
        "IP:127.0.0.1", f"IP:{SERVICE_FIRST_IP}",
    ])
    _gen_cert(pki, "apiserver", "/CN=kube-apiserver",
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n")
    for user, subj in CLIENTS.items():
        _gen_cert(pki, user, subj,
                  "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                  "extendedKeyUsage=clientAuth\n")
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", "sa.key.tmp", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key.tmp", "-pubout", "-out", "sa.pub", cwd=pki)
        os.replace(pki / "sa.key.tmp", pki / "sa.key")


def _write_kubeconfigs(p: _Paths, server: str) -> None:
    for user in CLIENTS:
        text = f"""apiVersion: v1
kind: Config
clusters:
- name: wmrl
  cluster:
    server: {server}
    certificate-authority: {p.pki / 'ca.crt'}
users:
- name: {user}
  user:
    client-certificate: {p.pki / (user + '.crt')}
    client-key: {p.pki / (user + '.key')}
contexts:
- name: wmrl
  context:
    cluster: wmrl
    user: {user}
    namespace: default
current-context: wmrl
"""
        path = p.kubeconfig(user)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)


# --------------------------------------------------------------------------
# kwok configuration: stages driven by annotations

KWOK_PHASE_ANNOTATION = "wmrl.dev/kwok-phase"
KWOK_COMPLETE_AFTER_ANNOTATION = "wmrl.dev/kwok-complete-after"

_NOT_DELETING = """    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'"""

_POD_IPS = """      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}"""


def _terminal_stage(name: str, phase: str, exit_code: int, reason: str,
                    selector_extra: str, delay: str = "", deleting: bool = False) -> str:
    deletion = _NOT_DELETING.replace("DoesNotExist", "Exists") if deleting else _NOT_DELETING
    return f"""---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: {name}
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
{deletion}
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending', 'Running']
{selector_extra}
{delay}  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $start := or .status.startTime $now }}}}
      conditions:
      {{{{ range .status.conditions }}}}
      {{{{ if eq .type "DisruptionTarget" }}}}
      - type: DisruptionTarget
        status: {{{{ .status | Quote }}}}
        reason: {{{{ or .reason "" | Quote }}}}
        message: {{{{ or .message "" | Quote }}}}
        lastTransitionTime: {{{{ or .lastTransitionTime $now | Quote }}}}
      {{{{ end }}}}
      {{{{ end }}}}
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        reason: PodCompleted
        type: Ready
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        reason: PodCompleted
        type: ContainersReady
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: PodScheduled
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: {exit_code}
            reason: {reason}
            startedAt: {{{{ $start | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: {phase}
      startTime: {{{{ $start | Quote }}}}
"""


def kwok_config(ports: Dict[str, int]) -> str:
    ann = f'.metadata.annotations["{KWOK_PHASE_ANNOTATION}"]'
    after = f'.metadata.annotations["{KWOK_COMPLETE_AFTER_ANNOTATION}"]'
    docs = [f"""apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: {POD_CIDR}
  nodeIP: 10.255.0.1
  serverAddress: 127.0.0.1:{ports['kwok']}
  manageAllNodes: false
  manageNodesWithLabelSelector: type=kwok
  nodeLeaseDurationSeconds: 40
  nodeLeaseParallelism: 4
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  podsOnNodeSyncParallelism: 2
  enableDebuggingHandlers: false
  enableProfilingHandler: false
  enableContentionProfiling: false
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
""",
        # --- nodes: become Ready, keep the capacity they were created with
        """---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: wmrl-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $since := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $since | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      - address: {{ NodeName | Quote }}
        type: Hostname
      {{ with NodePort }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}
      allocatable:
      {{ with .status.allocatable }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: "16"
        memory: 64Gi
        pods: "110"
      {{ end }}
      capacity:
      {{ with .status.capacity }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: "16"
        memory: 64Gi
        pods: "110"
      {{ end }}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
        kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
        containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
        kernelVersion: {{ printf "kwok-%s" Version | Quote }}
        bootID: ""
        machineID: ""
        osImage: ""
        systemUUID: ""
      phase: Running
""",
        # --- nodes: periodic condition heartbeat (leases are renewed by kwok)
        """---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: wmrl-node-heartbeat
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  delay:
    durationMilliseconds: 20000
    jitterDurationMilliseconds: 25000
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $since := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $since | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
""",
        # --- pods: Pending -> Running + Ready (unless a terminal phase is requested)
        f"""---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: wmrl-pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
{_NOT_DELETING}
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
    - key: '{ann}'
      operator: 'NotIn'
      values: ['Succeeded', 'Failed']
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: Ready
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: ContainersReady
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: PodScheduled
      {{{{ range .spec.readinessGates }}}}
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: {{{{ .conditionType | Quote }}}}
      {{{{ end }}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      initContainerStatuses:
      {{{{ range .spec.initContainers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: true
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            startedAt: {{{{ $now | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
{_POD_IPS}
      phase: Running
      startTime: {{{{ $now | Quote }}}}
""",
        _terminal_stage("wmrl-pod-succeeded", "Succeeded", 0, "Completed", f"""    - key: '{ann}'
      operator: 'In'
      values: ['Succeeded']"""),
        _terminal_stage("wmrl-pod-failed", "Failed", 1, "Error", f"""    - key: '{ann}'
      operator: 'In'
      values: ['Failed']"""),
        _terminal_stage("wmrl-pod-complete-after", "Succeeded", 0, "Completed", f"""    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values: ['Job']
    - key: '{after}'
      operator: 'Exists'
    - key: '{ann}'
      operator: 'NotIn'
      values: ['Succeeded', 'Failed']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']""", delay=f"""  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '{after}'
"""),
        # --- pods being deleted first stop, as a kubelet stops them: their containers are killed and
        # the pod fails (keeping a DisruptionTarget condition that an eviction or preemption set, which
        # the Job controller's podFailurePolicy reads) ...
        _terminal_stage("wmrl-pod-delete-kill", "Failed", 137, "Error", "", deleting=True),
        # --- ... and once terminal they are removed
        f"""---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: wmrl-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'In'
      values: ['Succeeded', 'Failed']
  next:
    delete: true
""",
    ]
    return "".join(docs)


def nodes_manifest() -> str:
    docs = []
    for name, cpu, mem, gpus in NODES:
        labels = {
            "type": "kwok",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node-role.kubernetes.io/worker": "",
        }
        res = {"cpu": cpu, "memory": mem, "pods": "110", "ephemeral-storage": "1Ti"}
        if gpus:
            labels["nvidia.com/gpu.present"] = "true"
            res["nvidia.com/gpu"] = gpus
        docs.append({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake",
                                "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {},
            "status": {"capacity": res, "allocatable": dict(res)},
        })
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=1)


# --------------------------------------------------------------------------
# process management


_CHILDREN: Dict[int, subprocess.Popen] = {}


def _read_pid(p: _Paths, comp: str) -> Optional[int]:
    try:
        return int(p.pidfile(comp).read_text().strip())
    except (OSError, ValueError):
        return None


def _pid_is(pid: int, comp: str) -> bool:
    """Is `pid` alive and running the binary for `comp`?"""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return os.path.basename(cmd) == comp


def _running(pid: int, comp: str) -> bool:
    if pid in _CHILDREN:
        # started by this process: poll() is exact (right after the spawn,
        # /proc/<pid>/cmdline may still show the pre-exec command line)
        return _CHILDREN[pid].poll() is None
    return _pid_is(pid, comp)


def _alive(p: _Paths, comp: str) -> bool:
    pid = _read_pid(p, comp)
    return pid is not None and _running(pid, comp)


def _spawn(p: _Paths, comp: str, args: Sequence[str],
           env: Optional[Dict[str, str]] = None) -> int:
    p.logs.mkdir(parents=True, exist_ok=True)
    p.pids.mkdir(parents=True, exist_ok=True)
    logf = open(p.logs / f"{comp}.log", "ab")
    logf.write(f"\n==== {time.ctime()} starting {comp}\n".encode())
    logf.flush()
    proc = subprocess.Popen([str(binary(comp)), *args], stdin=subprocess.DEVNULL,
                            stdout=logf, stderr=subprocess.STDOUT, cwd=str(p.root),
                            start_new_session=True, close_fds=True, env=env)
    logf.close()
    p.pidfile(comp).write_text(f"{proc.pid}\n")
    _CHILDREN[proc.pid] = proc
    return proc.pid


def _stop(p: _Paths, comp: str, timeout: float = 15.0) -> None:
    pid = _read_pid(p, comp)
    if pid is None:
        return
    if _running(pid, comp):
        log(f"stopping {comp} (pid {pid})")
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)  # each component leads its own session/group
            except ProcessLookupError:
                break
            except PermissionError:
                os.kill(pid, sig)
            deadline = time.time() + wait
            while time.time() < deadline and _running(pid, comp):
                time.sleep(0.1)
            if not _running(pid, comp):
                break
    _CHILDREN.pop(pid, None)
    with contextlib.suppress(FileNotFoundError):
        p.pidfile(comp).unlink()


# --------------------------------------------------------------------------
# health checks


def _get(url: str, ctx: Optional[ssl.SSLContext] = None, timeout: float = 3.0) -> tuple:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ssl.SSLError) as e:
        return None, str(e)


def _admin_ctx(p: _Paths) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(p.pki / "ca.crt"))
    ctx.load_cert_chain(str(p.pki / "admin.crt"), str(p.pki / "admin.key"))
    return ctx


def _insecure_ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _healthy(p: _Paths, comp: str, ports: Dict[str, int]) -> bool:
    if comp == "etcd":
        code, body = _get(f"http://127.0.0.1:{ports['etcd_client']}/health")
        return code == 200 and '"true"' in body
    if comp == "kube-apiserver":
        if not (p.pki / "admin.crt").exists():
            return False
        code, _ = _get(f"https://127.0.0.1:{ports['apiserver']}/readyz", _admin_ctx(p))
        return code == 200
    if comp == "kube-controller-manager":
        code, _ = _get(f"https://127.0.0.1:{ports['controller_manager']}/healthz", _insecure_ctx())
        return code == 200
    if comp == "kube-scheduler":
        code, _ = _get(f"https://127.0.0.1:{ports['scheduler']}/healthz", _insecure_ctx())
        return code == 200
    if comp == "kwok":
        code, _ = _get(f"http://127.0.0.1:{ports['kwok']}/healthz")
        return code == 200
    raise KeyError(comp)


def _wait(what: str, pred, timeout: float, p: Optional[_Paths] = None,
          comp: Optional[str] = None, interval: float = 0.2) -> None:
    deadline = time.time() + timeout
    while True:
        if pred():
            return
        if p is not None and comp is not None and not _alive(p, comp):
            tail = _log_tail(p, comp)
            pid = _read_pid(p, comp)
            rc = _CHILDREN[pid].poll() if pid in _CHILDREN else "?"
            raise _ComponentExited(f"{comp} (pid {pid}, exit status {rc}) exited while "
                               f"waiting for {what}; log tail:\n{tail}")
        if time.time() > deadline:
            extra = ("\n" + _log_tail(p, comp)) if (p and comp) else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


def _log_tail(p: _Paths, comp: str, n: int = 30) -> str:
    try:
        lines = (p.logs / f"{comp}.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])
    except OSError:
        return "(no log)"


def _cluster_ready(p: _Paths, ports: Dict[str, int]) -> bool:
    return all(_alive(p, c) and _healthy(p, c, ports) for c in COMPONENTS)


# --------------------------------------------------------------------------
# component command lines


def _args(p: _Paths, ports: Dict[str, int]) -> Dict[str, List[str]]:
    pki = p.pki
    kc = p.kubeconfig
    etcd_url = f"http://127.0.0.1:{ports['etcd_client']}"
    return {
        "etcd": [
            "--name=wmrl",
            f"--data-dir={p.etcd_data}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
            f"--initial-cluster=wmrl=http://127.0.0.1:{ports['etcd_peer']}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # test cluster: speed over durability
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            f"--etcd-servers={etcd_url}",
            # every address, so that Pods of the real node reach it: the kubernetes Service's
            # endpoint is the advertised (host) address
            "--bind-address=0.0.0.0",
            f"--secure-port={ports['apiserver']}",
            f"--advertise-address={_host_ip()}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            # the real node's name (real-0) is no DNS name here; its InternalIP is
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=lease",
            "--profiling=false",
            "--v=1",
        ],
        "kube-controller-manager": [
            f"--kubeconfig={kc('controller-manager')}",
            f"--authentication-kubeconfig={kc('controller-manager')}",
            f"--authorization-kubeconfig={kc('controller-manager')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['controller_manager']}",
            f"--cert-dir={p.root / 'kcm-certs'}",
            "--controllers=*,bootstrapsigner,tokencleaner",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ],
        "kube-scheduler": [
            f"--kubeconfig={kc('scheduler')}",
            f"--authentication-kubeconfig={kc('scheduler')}",
            f"--authorization-kubeconfig={kc('scheduler')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['scheduler']}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ],
        "kwok": [
            f"--kubeconfig={kc('kwok')}",
            f"--config={p.kwok_config}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-label-selector=type=kwok",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            f"--cidr={POD_CIDR}",
            "--node-lease-duration-seconds=40",
        ],
    }


# --------------------------------------------------------------------------
# up / down


def _resolve(state_dir) -> _Paths:
    return _Paths(Path(state_dir) if state_dir else default_state_dir())


def _make_cluster(p: _Paths, ports: Dict[str, int], started: bool) -> Cluster:
    return Cluster(state_dir=p.root, kubeconfig=p.admin_kubeconfig,
                   server=f"https://127.0.0.1:{ports['apiserver']}",
                   versions=versions(), started=started)


def status(state_dir=None) -> Dict[str, bool]:
    p = _resolve(state_dir)
    ports = _ports()
    return {c: _alive(p, c) and _healthy(p, c, ports) for c in COMPONENTS}


def up(state_dir=None, timeout: float = 120.0, _cli: bool = True,
       real_node: bool = False) -> Cluster:
    """Start (or reuse) the cluster; returns a Cluster with .kubeconfig.
    Clusters started or reused via up() stay up until down() (see acquire()
    / release() for the test-session variant). real_node=True also starts (or reuses)
    the real kubelet node (start_real_node())."""
    c = _up_control_plane(state_dir, timeout, _cli)
    if real_node:
        start_real_node(c, _cli=_cli)
    return c


def _up_control_plane(state_dir, timeout: float, _cli: bool) -> Cluster:
    p = _resolve(state_dir)
    ports = _ports()
    with _locked(p):
        if _cluster_ready(p, ports):
            log(f"cluster already running in {p.root}")
            if _cli:
                with contextlib.suppress(FileNotFoundError):
                    p.ephemeral.unlink()
            return _make_cluster(p, ports, started=False)
        build(["control-plane"])
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(p.holders)
        if _cli:
            with contextlib.suppress(FileNotFoundError):
                p.ephemeral.unlink()
        else:
            p.ephemeral.touch()
        t0 = time.time()
        # anything half-running from an earlier attempt is restarted from scratch
        for comp in reversed(COMPONENTS):
            _stop(p, comp)
        if p.etcd_data.exists():
            shutil.rmtree(p.etcd_data)
        for d in (p.logs, p.pids):
            d.mkdir(parents=True, exist_ok=True)
        server = f"https://127.0.0.1:{ports['apiserver']}"
        _ensure_pki(p)
        _write_kubeconfigs(p, server)
        p.kwok_config.write_text(kwok_config(ports))
        p.nodes.write_text(nodes_manifest())
        args = _args(p, ports)
        _check_ports(ports)
        for attempt in (1, 2):
            try:
                _start_once(p, ports, args, timeout, t0)
                break
            except BaseException as e:
                log("startup failed; stopping components (logs in %s)" % p.logs)
                for comp in reversed(COMPONENTS):
                    _stop(p, comp)
                if p.etcd_data.exists():
                    shutil.rmtree(p.etcd_data)
                # a component dying during startup (e.g. killed from outside)
                # gets one more try; timeouts and interrupts do not
                if attempt == 2 or not isinstance(e, _ComponentExited):
                    raise
                log(f"{e}\nretrying once")
        log(f"cluster up in {time.time() - t0:.1f}s; kubeconfig {p.admin_kubeconfig}")
        return _make_cluster(p, ports, started=True)


class _ComponentExited(RuntimeError):
    pass


def _check_ports(ports: Dict[str, int]) -> None:
    busy = []
    for name, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                busy.append(f"{name}={port}")
    if busy:
        raise RuntimeError(
            f"ports in use: {', '.join(busy)} (another cluster with a different "
            "WMRL_CLUSTER_DIR?); set WMRL_CLUSTER_PORT_OFFSET to shift all ports")


def _start_once(p: _Paths, ports: Dict[str, int], args: Dict[str, List[str]],
                timeout: float, t0: float) -> None:
    log("starting etcd")
    _spawn(p, "etcd", args["etcd"])
    _wait("etcd health", lambda: _healthy(p, "etcd", ports), 30, p, "etcd")
    log("starting kube-apiserver")
    _spawn(p, "kube-apiserver", args["kube-apiserver"])
    _wait("kube-apiserver /readyz", lambda: _healthy(p, "kube-apiserver", ports),
          timeout, p, "kube-apiserver")
    log(f"kube-apiserver ready after {time.time() - t0:.1f}s")
    for comp in ("kube-controller-manager", "kube-scheduler", "kwok"):
        log(f"starting {comp}")
        _spawn(p, comp, args[comp])
    kubectl("apply", "-f", str(p.nodes), kubeconfig=p.admin_kubeconfig)
    for comp in ("kube-controller-manager", "kube-scheduler", "kwok"):
        _wait(f"{comp} health", lambda c=comp: _healthy(p, c, ports), timeout, p, comp)
    _wait("nodes Ready", lambda: _nodes_ready(p), timeout, p, "kwok", interval=0.5)
    _wait("default ServiceAccount",
          lambda: kubectl("get", "serviceaccount", "default", "-n", "default",
                          kubeconfig=p.admin_kubeconfig, check=False).returncode == 0,
          timeout, p, "kube-controller-manager", interval=0.5)


def _nodes_ready(p: _Paths) -> bool:
    res = kubectl("get", "nodes", "-l", "type=kwok", "-o", "json",
                  kubeconfig=p.admin_kubeconfig, check=False)
    if res.returncode != 0:
        return False
    items = json.loads(res.stdout).get("items", [])
    names = {n for n, *_ in NODES}
    ready = set()
    for node in items:
        for cond in node.get("status", {}).get("conditions", []) or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready.add(node["metadata"]["name"])
        if node.get("spec", {}).get("taints"):
            ready.discard(node["metadata"]["name"])  # wait for not-ready taints to go
    return names <= ready


def restart_apiserver(state_dir=None, downtime: float = 3.0, timeout: float = 120.0) -> float:
    """Stop kube-apiserver, leave it down ``downtime`` seconds, start it again on the same etcd
    data, certificates and port, and wait until it is ready. Every client (controller-manager,
    scheduler, kwok, operators under test) sees its connections and watches drop, as in an
    apiserver upgrade or crash. Returns how long the apiserver was unavailable (seconds)."""
    p = _resolve(state_dir)
    ports = _ports()
    with _locked(p):
        if not _cluster_ready(p, ports):
            raise RuntimeError(f"no running cluster in {p.root} to restart the apiserver of")
        t0 = time.time()
        _stop(p, "kube-apiserver")
        time.sleep(downtime)
        _spawn(p, "kube-apiserver", _args(p, ports)["kube-apiserver"])
        _wait("kube-apiserver /readyz after restart", lambda: _healthy(p, "kube-apiserver", ports),
              timeout, p, "kube-apiserver")
        _wait("cluster ready after apiserver restart", lambda: _cluster_ready(p, ports), timeout)
        return time.time() - t0


def down(state_dir=None) -> None:
    """Stop every component started by up() (the real node first, putting the host back as
    it was) and wipe etcd data."""
    p = _resolve(state_dir)
    if not p.root.exists():
        return
    with _locked(p):
        _down_locked(p)


def _down_locked(p: _Paths) -> None:
    try:
        _stop_real_node_locked(p)
    finally:  # the control plane stops even if the node's teardown left something
        for comp in reversed(COMPONENTS):
            _stop(p, comp)
        if p.etcd_data.exists():
            shutil.rmtree(p.etcd_data)
        for f in (p.ephemeral, _imports_file(p)):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        if p.holders.exists():
            shutil.rmtree(p.holders, ignore_errors=True)
        log(f"cluster in {p.root} stopped")


# --------------------------------------------------------------------------
# shared use by several test sessions (pytest fixture)


def _live_holders(p: _Paths) -> List[int]:
    return _live_pids(p.holders)


def _live_pids(holders: Path) -> List[int]:
    live = []
    if holders.is_dir():
        for f in holders.iterdir():
            try:
                pid = int(f.name)
                os.kill(pid, 0)
                live.append(pid)
            except (ValueError, ProcessLookupError):
                f.unlink(missing_ok=True)
            except PermissionError:
                live.append(pid)
    return live


def acquire(state_dir=None, timeout: float = 120.0) -> Cluster:
    """up() for a test session: registers this process as a holder.  A
    cluster started here is marked ephemeral: the last holder to release() it
    stops it.  A cluster started by the `up` CLI is never stopped by
    release()."""
    c = up(state_dir, timeout=timeout, _cli=False)
    p = _Paths(c.state_dir)
    with _locked(p):
        p.holders.mkdir(parents=True, exist_ok=True)
        (p.holders / str(os.getpid())).touch()
    return c


def make_persistent(cluster: Cluster) -> None:
    """Keep the cluster running after the last release()."""
    with contextlib.suppress(FileNotFoundError):
        _Paths(cluster.state_dir).ephemeral.unlink()


def release(cluster: Cluster) -> None:
    """Undo acquire(); stops an ephemeral cluster once no holder is left."""
    p = _Paths(cluster.state_dir)
    with _locked(p):
        with contextlib.suppress(FileNotFoundError):
            (p.holders / str(os.getpid())).unlink()
        others = _live_holders(p)
        if not p.ephemeral.exists():
            return
        if others:
            log(f"leaving cluster running for other sessions (pids {others})")
            return
        _down_locked(p)


# --------------------------------------------------------------------------
# the real node: a kubelet with containerd, kube-proxy and CoreDNS beside the kwok nodes
# (tests/cluster/README.md, "Real node"; the configurations are in nodeconfig.py, the host
# state it changes and restores in hoststate.py)


@dataclass
class RealNode:
    name: str
    state_dir: Path          # the cluster's state directory
    root: Path               # the node's files: nodeconfig.node_root(state_dir)
    node_ip: str
    pod_cidr: str
    dns_ip: str              # CoreDNS (the kubelet's clusterDNS), on the Pods' bridge
    ctr: Path
    containerd_socket: Path
    images: Dict[str, str]   # our own images, imported at start: {"pause": ref, "nodetool": ref}
    started: bool = False    # True if this call started it
    label: Dict[str, str] = field(default_factory=lambda: dict(nodeconfig.NODE_LABEL))
    toleration: Dict[str, str] = field(default_factory=lambda: dict(nodeconfig.TOLERATION))

    def placement(self) -> dict:
        """Pod spec fields that put a Pod on this node (and only there)."""
        return {"nodeSelector": dict(self.label), "tolerations": [dict(self.toleration)]}

    def ctr_run(self, *args: str, check: bool = True,
                timeout: float = 600) -> subprocess.CompletedProcess:
        """ctr against the node's containerd, in the CRI's namespace (k8s.io)."""
        return _ctr(self.ctr, self.containerd_socket, *args, check=check, timeout=timeout)

    def import_image(self, tarball: os.PathLike) -> List[str]:
        """Import an OCI or docker archive (ociimage.py, `docker save`, `buildah push
        oci-archive:`) into the node's containerd; returns the names imported. Pods use them
        with imagePullPolicy Never or IfNotPresent (no registry is reachable). A name without
        a registry, e.g. "foo:1", is docker.io/library/foo:1 to the CRI: import it as that.
        The archive is imported again whenever the node restarts while the cluster runs."""
        path = Path(tarball).resolve()
        names = _import_image(self.ctr, self.containerd_socket, path)
        _remember_import(_Paths(self.state_dir), path)
        return names

    def image_names(self) -> List[str]:
        return self.ctr_run("images", "list", "-q").stdout.split()


def _layout(p: _Paths):
    return nodeconfig.Layout(nodeconfig.node_root(p.root))


def _ctr(ctr: Path, sock: Path, *args: str, check: bool = True,
         timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [str(ctr), "--address", str(sock), "--namespace", nodeconfig.CRI_NAMESPACE, *args]
    res = subprocess.run(cmd, text=True, timeout=timeout, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    if check and res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr)
    return res


def _import_image(ctr: Path, sock: Path, tarball: Path) -> List[str]:
    if not tarball.is_file():
        raise FileNotFoundError(f"image archive {tarball} does not exist")
    t0 = time.time()
    res = _ctr(ctr, sock, "images", "import", "--local", "--platform", "linux/amd64",
               str(tarball))
    names = re.findall(r"^unpacking (\S+) \(", res.stdout, re.M)
    log(f"imported {', '.join(names) or tarball.name} in {time.time() - t0:.1f}s")
    return names


def _imports_file(p: _Paths) -> Path:
    # outside the node's directory, which stop_real_node() removes
    return p.root / "real-node-images.json"


def _remember_import(p: _Paths, path: Path) -> None:
    with _locked(p):
        f = _imports_file(p)
        known = json.loads(f.read_text()) if f.exists() else []
        if str(path) not in known:
            f.write_text(json.dumps([*known, str(path)], indent=1))


def _node_env(lay) -> Dict[str, str]:
    # containerd finds the runc shim on PATH; its temporary mounts go under the node's dir
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(binary("containerd-shim-runc-v2").parent),
                                   str(binary("runc").parent), "/usr/sbin", "/usr/bin",
                                   "/sbin", "/bin"])
    env["TMPDIR"] = str(lay.containerd_tmp)
    return env


def _node_healthy(p: _Paths, comp: str) -> bool:
    lay = _layout(p)
    if comp == "containerd":
        return lay.containerd_socket.exists() and _ctr(
            binary("ctr"), lay.containerd_socket, "version", check=False, timeout=10).returncode == 0
    url = {
        "kubelet": f"http://127.0.0.1:{nodeconfig.PORTS['kubelet_healthz']}/healthz",
        "kube-proxy": f"http://127.0.0.1:{nodeconfig.PORTS['kube_proxy_healthz']}/healthz",
        "coredns": f"http://127.0.0.1:{nodeconfig.PORTS['coredns_ready']}/ready",
    }[comp]
    return _get(url)[0] == 200


def real_node_status(state_dir=None) -> Dict[str, bool]:
    """{"real-node/<component>": healthy} while a real node is (or was, in a crash) up."""
    p = _resolve(state_dir)
    if not _layout(p).record.exists():
        return {}
    return {f"real-node/{c}": _alive(p, c) and _node_healthy(p, c)
            for c in nodeconfig.COMPONENTS}


def _node_object(p: _Paths) -> Optional[dict]:
    res = kubectl("get", "node", nodeconfig.NODE_NAME, "-o", "json",
                  kubeconfig=p.admin_kubeconfig, check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def _node_ready(node: Optional[dict]) -> bool:
    """Registered, Ready, and labelled and tainted as the real node is."""
    if not node:
        return False
    labels = node["metadata"].get("labels", {})
    taints = node.get("spec", {}).get("taints") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in node.get("status", {}).get("conditions") or [])
    tainted = any(t.get("key") == nodeconfig.NODE_TAINT["key"] and
                  t.get("effect") == nodeconfig.NODE_TAINT["effect"] for t in taints)
    return ready and tainted and all(labels.get(k) == v for k, v in nodeconfig.NODE_LABEL.items())


def _real_node_running(p: _Paths) -> bool:
    return _layout(p).record.exists() and all(
        _alive(p, c) and _node_healthy(p, c) for c in nodeconfig.COMPONENTS) and \
        _node_ready(_node_object(p))


def _make_real_node(p: _Paths, started: bool) -> RealNode:
    lay = _layout(p)
    return RealNode(name=nodeconfig.NODE_NAME, state_dir=p.root, root=lay.root,
                    node_ip=_host_ip(), pod_cidr=nodeconfig.POD_CIDR,
                    dns_ip=nodeconfig.gateway(), ctr=binary("ctr"),
                    containerd_socket=lay.containerd_socket,
                    images={n: own_image(n)[0] for n in OWN_IMAGES}, started=started)


def _check_apiserver_for_pods(p: _Paths) -> None:
    """The real node's Pods reach the apiserver at the host address (the kubernetes Service's
    endpoint), and the apiserver reaches the kubelet with a client cert: a control plane
    started before these flags existed has neither."""
    pid = _read_pid(p, "kube-apiserver")
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except (OSError, TypeError):
        argv = []
    want = ["--bind-address=0.0.0.0", "--kubelet-client-certificate=",
            "--kubelet-preferred-address-types=InternalIP"]
    missing = [w for w in want if not any(a.startswith(w) for a in argv)]
    if missing:
        raise RuntimeError(
            f"the running kube-apiserver (pid {pid}) lacks {missing}, which the real node needs; "
            f"restart the cluster in {p.root} (tests/cluster/down, then up)")


def _check_host_free() -> None:
    """Nothing of another real node or kubelet on this machine (there can be one per machine:
    the ports, the bridge and the kubelet's cgroups are host-wide)."""
    taken = [f"cgroup {d}" for d in hoststate.kubepods_dirs()]
    if hoststate.link_exists(nodeconfig.BRIDGE):
        taken.append(f"network link {nodeconfig.BRIDGE}")
    taken += [f"{tool} chain {c}" for tool, chains in hoststate.iptables_chains().items()
              for c in chains if c.split("/", 1)[1].startswith("KUBE-")]
    if taken:
        raise RuntimeError(f"{', '.join(taken)} already exist(s), and not from a real node of "
                           "this cluster (another cluster's real node, or a kubelet?)")
    busy = []
    for name, port in nodeconfig.PORTS.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(f"{name}={port}")
    if busy:
        raise RuntimeError(f"ports of the real node in use: {', '.join(busy)} (another real "
                           "node or kubelet on this machine? there can be one per machine)")


def start_real_node(cluster: Optional[Cluster] = None, state_dir=None, timeout: float = 240.0,
                    _cli: bool = True) -> RealNode:
    """Start (or reuse) the real node ``real-0`` of the running cluster: containerd, CoreDNS,
    the kubelet and kube-proxy, with our pause and nodetool images imported. Builds what is
    missing first. It changes host settings (sysctls, iptables, a bridge, cgroups), recorded
    before start and put back by stop_real_node() and down(). A node started here from the
    CLI (_cli=True) stays up until one of those; see acquire_real_node() for tests."""
    p = _resolve(state_dir or (cluster.state_dir if cluster else None))
    lay = _layout(p)
    with _locked(p):
        if not _cluster_ready(p, _ports()):
            raise RuntimeError(f"no running cluster in {p.root}; start it first (up())")
        if _real_node_running(p):
            log(f"real node {nodeconfig.NODE_NAME} already running")
            if _cli:
                with contextlib.suppress(FileNotFoundError):
                    lay.ephemeral.unlink()
            return _make_real_node(p, started=False)
        build(["node"])
        _check_apiserver_for_pods(p)
        _stop_real_node_locked(p)  # what an earlier run left (a crash, a failed start)
        _check_host_free()
        t0 = time.time()
        try:
            _start_real_node_once(p, lay, timeout)
        except BaseException:
            log(f"real node failed to start; stopping it (logs in {p.logs})")
            _stop_real_node_locked(p)
            raise
        if not _cli:
            lay.ephemeral.touch()
        log(f"real node {nodeconfig.NODE_NAME} Ready in {time.time() - t0:.1f}s")
        return _make_real_node(p, started=True)


def _start_real_node_once(p: _Paths, lay, timeout: float) -> None:
    node_ip = _host_ip()
    if node_ip.startswith("127."):
        raise RuntimeError("the real node needs a non-loopback host address (the kubelet "
                           "refuses a loopback node IP); this machine has no default route")
    for tool in ("bridge", "host-local"):
        if not (nodeconfig.CNI_BIN_DIR / tool).is_file():
            raise RuntimeError(f"CNI plugin {nodeconfig.CNI_BIN_DIR / tool} missing (Debian "
                               "package containernetworking-plugins; tests/cluster/build node)")
    hoststate.record(lay)  # before anything changes the host
    for d in lay.dirs():
        d.mkdir(parents=True, exist_ok=True)
    pause_ref, _ = own_image("pause")
    lay.containerd_config.write_text(nodeconfig.containerd_config(lay, binary("runc"), pause_ref))
    (lay.cni_conf_dir / "10-wmrl.conflist").write_text(nodeconfig.cni_conflist(lay))
    lay.kubelet_config.write_text(nodeconfig.kubelet_config(lay, p.pki / "ca.crt"))
    lay.resolv_conf.write_text(nodeconfig.resolv_conf())
    lay.corefile.write_text(nodeconfig.corefile(p.kubeconfig("coredns")))
    kubectl("apply", "-f", "-", input=json.dumps(nodeconfig.coredns_rbac()),
            kubeconfig=p.admin_kubeconfig)
    problems = hoststate.write_sysctls(nodeconfig.SYSCTLS_AT_START)
    if problems:
        raise RuntimeError("; ".join(problems))
    # the bridge exists before any Pod, so that CoreDNS can listen on its address
    gw = nodeconfig.gateway()
    prefix = nodeconfig.POD_CIDR.split("/")[1]
    for cmd in (["ip", "link", "add", nodeconfig.BRIDGE, "type", "bridge"],
                ["ip", "addr", "add", f"{gw}/{prefix}", "dev", nodeconfig.BRIDGE],
                ["ip", "link", "set", nodeconfig.BRIDGE, "up"]):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    log("starting containerd")
    _spawn(p, "containerd", nodeconfig.containerd_args(lay), env=_node_env(lay))
    _wait("containerd", lambda: _node_healthy(p, "containerd"), 60, p, "containerd", 0.3)
    for name in OWN_IMAGES:
        _import_image(binary("ctr"), lay.containerd_socket, own_image(name)[1])
    f = _imports_file(p)
    for archive in (json.loads(f.read_text()) if f.exists() else []):
        if Path(archive).is_file():  # what tests imported before the node restarted
            _import_image(binary("ctr"), lay.containerd_socket, Path(archive))
    log("starting coredns")
    _spawn(p, "coredns", nodeconfig.coredns_args(lay))
    _wait("coredns /ready", lambda: _node_healthy(p, "coredns"), 60, p, "coredns", 0.3)
    log("starting kubelet")
    _spawn(p, "kubelet", nodeconfig.kubelet_args(lay, p.kubeconfig("kubelet"), node_ip))
    _wait(f"node {nodeconfig.NODE_NAME} registered", lambda: _node_object(p) is not None,
          timeout, p, "kubelet", 0.5)
    # kube-proxy reads its node's addresses from the Node object
    log("starting kube-proxy")
    _spawn(p, "kube-proxy", nodeconfig.kube_proxy_args(p.kubeconfig("kube-proxy")))
    _wait("kube-proxy /healthz", lambda: _node_healthy(p, "kube-proxy"), timeout, p,
          "kube-proxy", 0.5)
    _wait(f"node {nodeconfig.NODE_NAME} Ready", lambda: _node_ready(_node_object(p)),
          timeout, p, "kubelet", 0.5)


def stop_real_node(state_dir=None) -> None:
    """Stop the real node and put the host back as it was before it started (sysctls,
    iptables chains, the bridge, mounts, cgroups, leftover Pods and shims); the control plane
    keeps running. Idempotent, and safe after a crash (it works from the recorded state)."""
    p = _resolve(state_dir)
    if not p.root.exists():
        return
    with _locked(p):
        _stop_real_node_locked(p)


def _stop_real_node_locked(p: _Paths) -> None:
    lay = _layout(p)
    running = [c for c in nodeconfig.COMPONENTS if _alive(p, c)]
    if not running and not lay.record.exists() and not lay.root.exists():
        return
    if running or lay.record.exists():
        log(f"stopping real node {nodeconfig.NODE_NAME}")
    for comp in reversed(nodeconfig.COMPONENTS):
        _stop(p, comp)
    problems = hoststate.teardown(lay, log)
    if problems:
        raise RuntimeError("the real node's teardown left: " + "; ".join(problems))
    if _alive(p, "kube-apiserver"):
        # its Pods are gone with it: let the Pod GC remove them instead of waiting for a kubelet
        kubectl("delete", "node", nodeconfig.NODE_NAME, "--ignore-not-found", "--wait=false",
                kubeconfig=p.admin_kubeconfig, check=False)
    mounted = nodeconfig.mounts_under(Path("/proc/self/mountinfo").read_text(), lay.root)
    if mounted:  # never remove a tree that a mount (a Pod's hostPath, say) reaches into
        raise RuntimeError(f"still mounted under {lay.root}: {[str(m) for m in mounted]}")
    shutil.rmtree(lay.root, ignore_errors=True)


def acquire_real_node(cluster: Cluster, timeout: float = 240.0) -> RealNode:
    """start_real_node() for a test session: registers this process as a holder. A node
    started here is stopped (the host restored) by the last holder's release_real_node()."""
    node = start_real_node(cluster, timeout=timeout, _cli=False)
    p = _Paths(cluster.state_dir)
    lay = _layout(p)
    with _locked(p):
        lay.holders.mkdir(parents=True, exist_ok=True)
        (lay.holders / str(os.getpid())).touch()
    return node


def release_real_node(cluster: Cluster, keep: bool = False) -> None:
    """Undo acquire_real_node(): stops a node started by a test session once no holder is
    left (keep=True: leave it running, as WMRL_KEEP_CLUSTER does)."""
    p = _Paths(cluster.state_dir)
    lay = _layout(p)
    with _locked(p):
        with contextlib.suppress(FileNotFoundError):
            (lay.holders / str(os.getpid())).unlink()
        if keep:
            with contextlib.suppress(FileNotFoundError):
                lay.ephemeral.unlink()
            return
        others = _live_pids(lay.holders)
        if not lay.ephemeral.exists():
            return
        if others:
            log(f"leaving the real node running for other sessions (pids {others})")
            return
        _stop_real_node_locked(p)


# --------------------------------------------------------------------------
# CLI


def main(argv: Optional[Iterable[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[0] if argv else "up"
    state_dir = os.environ.get("WMRL_CLUSTER_DIR") or None
    flags = [a for a in argv[1:] if a.startswith("--")]
    if any(f != "--real-node" for f in flags) or (flags and cmd not in ("up", "down")):
        print(f"{cmd}: unknown option(s) {flags}; only up and down take --real-node",
              file=sys.stderr)
        return 2
    if cmd == "up":
        c = up(state_dir, real_node=bool(flags))
        print(c.kubeconfig, flush=True)
    elif cmd == "down":
        if flags:
            stop_real_node(state_dir)
        else:
            down(state_dir)
    elif cmd == "status":
        st = status(state_dir)
        st.update(real_node_status(state_dir))
        for comp, ok in st.items():
            print(f"{comp}: {'healthy' if ok else 'down'}")
        return 0 if all(st.values()) else 1
    elif cmd == "build":
        build()
    elif cmd == "kubeconfig":
        print(_resolve(state_dir).admin_kubeconfig)
    elif cmd == "versions":
        print(json.dumps(versions(), indent=1))
    elif cmd == "binary":
        print(binary(argv[1]))
    else:
        print(f"usage: {sys.argv[0]} up [--real-node]|down [--real-node]|status|build|"
              "kubeconfig|versions|binary NAME",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
