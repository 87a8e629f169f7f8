"""What the test cluster's real kubelet node is made of: names, addresses, directories, the
configuration files of containerd, the kubelet, kube-proxy, CNI and CoreDNS, and the decisions
of its teardown (which iptables rules, mounts and sysctls to undo).

Pure functions over plain data (no processes, no host access), so that they can be read and
tested without root; ``cluster.py`` acts on them and ``hoststate.py`` undoes what the node
changed on the host. Standard library only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

NODE_NAME = "real-0"
NODE_LABEL_KEY = "wmrl.dev/real-node"
NODE_LABEL = {NODE_LABEL_KEY: "true"}
NODE_TAINT = {"key": NODE_LABEL_KEY, "value": "true", "effect": "NoSchedule"}
# what a Pod needs to land on the real node
TOLERATION = {"key": NODE_LABEL_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}

# Pods of the real node: outside the control plane's POD_CIDR (10.244.0.0/16), from which kwok
# hands out its fake Pod IPs, so a real Pod IP never collides with a kwok one.
POD_CIDR = "10.245.0.0/24"
BRIDGE = "wmrl0"
CLUSTER_DOMAIN = "cluster.local"
CNI_NETWORK = "wmrl-real-node"
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
CRI_NAMESPACE = "k8s.io"

# Host-wide ports (there is one real node per machine: iptables, the bridge and the kubelet's
# cgroups are host-wide too).
PORTS = {
    "kubelet": 10250,
    "kubelet_healthz": 10248,
    "kube_proxy_healthz": 10256,
    "kube_proxy_metrics": 10249,
    "coredns_ready": 10281,
    "coredns_health": 10282,
}

# The components of the node, in start order; stopped in reverse.
COMPONENTS = ["containerd", "coredns", "kube-proxy", "kubelet"]

# Host settings the node's components change (the kubelet: kernel.panic*, vm.overcommit_memory,
# kernel.keys.*; kube-proxy: route_localnet and conntrack; the CNI bridge: forwarding; us:
# bridge-nf-call-iptables). Recorded before the node starts and written back when it stops.
SYSCTLS = [
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "kernel.keys.maxkeys",
    "kernel.keys.maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.default.forwarding",
    "net.ipv6.conf.all.forwarding",
    "net.ipv6.conf.default.forwarding",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.bridge.bridge-nf-call-arptables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "net.netfilter.nf_conntrack_tcp_be_liberal",
    "net.netfilter.nf_conntrack_udp_timeout",
    "net.netfilter.nf_conntrack_udp_timeout_stream",
]
# set by us at start (bridged Pod-to-Pod replies must pass kube-proxy's conntrack NAT)
SYSCTLS_AT_START = {"net.bridge.bridge-nf-call-iptables": "1"}

# iptables chains made by kube-proxy, the kubelet and the CNI plugins
CHAIN_PREFIXES = ("KUBE-", "CNI-")
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw")

# cgroup v1 directory that the kubelet (cgroupDriver: cgroupfs, cgroupsPerQOS) makes in every
# controller hierarchy
KUBEPODS_CGROUP = "kubepods"
# where the kubelet links container logs (fixed in the kubelet)
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# where the runc shim puts its sockets (fixed in containerd: defaults.DefaultStateDir + "/s")
SHIM_SOCKET_DIR = Path("/run/containerd/s")


def gateway(pod_cidr: str = POD_CIDR) -> str:
    """The bridge's address: the Pods' gateway, and where CoreDNS listens."""
    return str(next(ipaddress.ip_network(pod_cidr).hosts()))


OUTSIDE_ROOT = Path("/var/lib/wmrl-real-node")


def traversable_by_others(path: Path) -> bool:
    """Whether a user other than the owner can reach ``path`` (every directory above it lets others through)."""
    import os
    import stat

    for d in [*reversed(path.parents)]:
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        except FileNotFoundError:
            return True  # created below here with the default mode
    return True


def node_root(state_dir: Path) -> Path:
    """Where the real node keeps its files: ``<state dir>/real-node`` when others can reach it, else a
    directory of its own under /var/lib keyed by the state dir. A user-namespaced Pod's runtime runs
    as an unprivileged host uid while it mounts the Pod's rootfs and volumes, so every directory above
    them must let others through: ``~/.cache`` of root (mode 0700) does not."""
    inside = state_dir / "real-node"
    if traversable_by_others(inside):
        return inside
    key = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return OUTSIDE_ROOT / key


@dataclass(frozen=True)
class Layout:
    """Every path of a real node, under :func:`node_root`."""
    root: Path

    @property
    def record(self) -> Path:  # host state recorded before start; present while the node may run
        return self.root / "host-state.json"

    @property
    def holders(self) -> Path:
        return self.root / "holders"

    @property
    def ephemeral(self) -> Path:
        return self.root / "ephemeral"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_tmp(self) -> Path:
        return self.root / "containerd" / "tmp"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.json"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def volume_plugins(self) -> Path:
        return self.root / "volume-plugins"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"

    @property
    def corefile(self) -> Path:
        return self.root / "Corefile"

    def dirs(self) -> List[Path]:
        return [self.containerd_root, self.containerd_state, self.containerd_tmp, self.runc_root,
                self.cni_conf_dir, self.cni_ipam_dir, self.kubelet_root, self.pod_logs,
                self.volume_plugins, self.holders]


# --------------------------------------------------------------------------- configurations


def _toml_str(s: object) -> str:
    return json.dumps(str(s))  # a JSON string is a valid TOML basic string


def containerd_config(lay: Layout, runc: Path, sandbox_image: str) -> str:
    """containerd 2.x (config version 3): everything under the node's directory, the runc shim
    with our runc, CNI from our conf dir, Pods' network namespaces mounted under the state dir
    (not /run/netns, which podman also uses), and OOM score adjustments clamped to our own
    (root here lacks CAP_SYS_RESOURCE, so a lower score than ours cannot be set)."""
    q = _toml_str
    return f"""version = 3
root = {q(lay.containerd_root)}
state = {q(lay.containerd_state)}
temp = {q(lay.containerd_tmp)}
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = {q(lay.containerd_socket)}

[plugins.'io.containerd.internal.v1.opt']
  path = {q(lay.root / 'containerd' / 'opt')}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {q(sandbox_image)}

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  cdi_spec_dirs = []
  enable_criu = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = {q(runc)}
        Root = {q(lay.runc_root)}
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{q(CNI_BIN_DIR)}]
    conf_dir = {q(lay.cni_conf_dir)}
    max_conf_num = 1
    use_internal_loopback = true

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_conflist(lay: Layout, pod_cidr: str = POD_CIDR) -> str:
    """A bridge with host-local IPAM (its leases under the node's directory, not
    /var/lib/cni). No masquerading: Pods only talk to each other and to this host."""
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": True,
            "ipMasq": False,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": pod_cidr, "gateway": gateway(pod_cidr)}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": str(lay.cni_ipam_dir),
            },
        }],
    }, indent=1)


def kubelet_config(lay: Layout, client_ca: Path, pod_cidr: str = POD_CIDR) -> str:
    """KubeletConfiguration (JSON, which the kubelet reads as YAML). cgroup v1 is allowed
    (failCgroupV1: false: this kernel's hierarchy is v1), the host's paths are moved under the
    node's directory, eviction and image GC are kept out of the tests' way, and the node
    registers tainted so that only Pods that tolerate it land here."""
    return json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{lay.containerd_socket}",
        "address": "0.0.0.0",
        "port": PORTS["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": PORTS["kubelet_healthz"],
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [gateway(pod_cidr)],
        "resolvConf": str(lay.resolv_conf),
        "podLogsDir": str(lay.pod_logs),
        "volumePluginDir": str(lay.volume_plugins),
        "staticPodPath": "",
        "registerNode": True,
        "registerWithTaints": [NODE_TAINT],
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "failSwapOn": False,
        "maxPods": 110,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
    }, indent=1)


def resolv_conf(pod_cidr: str = POD_CIDR) -> str:
    """The kubelet's idea of the host's resolver (dnsPolicy: Default Pods get it too): our
    CoreDNS, so no Pod ever reaches for a resolver outside."""
    return f"nameserver {gateway(pod_cidr)}\n"


def corefile(kubeconfig: Path, pod_cidr: str = POD_CIDR) -> str:
    """cluster.local from the apiserver; every other name gets NXDOMAIN (nothing is
    forwarded: there is no internet here)."""
    ip = gateway(pod_cidr)
    return f"""{CLUSTER_DOMAIN}:53 {{
    bind {ip}
    errors
    ready 127.0.0.1:{PORTS['coredns_ready']}
    health 127.0.0.1:{PORTS['coredns_health']}
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {kubeconfig} wmrl
        pods insecure
        ttl 5
    }}
}}
.:53 {{
    bind {ip}
    errors
    template ANY ANY . {{
        rcode NXDOMAIN
    }}
}}
"""


COREDNS_USER = "wmrl:coredns"


def coredns_rbac() -> dict:
    """Read access for CoreDNS's kubernetes plugin (its client cert's CN is COREDNS_USER)."""
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": COREDNS_USER},
         "rules": [
             {"apiGroups": [""], "resources": ["services", "endpoints", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": COREDNS_USER},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": COREDNS_USER},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": COREDNS_USER}]},
    ]}


def kubelet_args(lay: Layout, kubeconfig: Path, node_ip: str) -> List[str]:
    labels = ",".join(f"{k}={v}" for k, v in NODE_LABEL.items())
    return [f"--config={lay.kubelet_config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={lay.kubelet_root}", f"--hostname-override={NODE_NAME}",
            f"--node-ip={node_ip}", f"--node-labels={labels}", "--v=1"]


def kube_proxy_args(kubeconfig: Path, pod_cidr: str = POD_CIDR) -> List[str]:
    """iptables mode. --oom-score-adj=0 and --conntrack-max-per-core=0: root here cannot lower
    its OOM score, and the conntrack table size is left to the host; so are the conntrack
    timeouts (0 = leave as is)."""
    return [f"--kubeconfig={kubeconfig}", "--proxy-mode=iptables",
            f"--hostname-override={NODE_NAME}", f"--cluster-cidr={pod_cidr}",
            "--oom-score-adj=0", "--conntrack-max-per-core=0", "--conntrack-min=0",
            "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
            f"--healthz-bind-address=127.0.0.1:{PORTS['kube_proxy_healthz']}",
            f"--metrics-bind-address=127.0.0.1:{PORTS['kube_proxy_metrics']}",
            "--iptables-localhost-nodeports=false", "--nodeport-addresses=primary", "--v=1"]


def coredns_args(lay: Layout) -> List[str]:
    return ["-conf", str(lay.corefile)]


def containerd_args(lay: Layout) -> List[str]:
    return ["--config", str(lay.containerd_config), "--log-level", "info"]


# ----------------------------------------------------------------------- teardown decisions


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def sysctls_to_restore(recorded: Mapping[str, str], now: Mapping[str, str]) -> Dict[str, str]:
    """The recorded values that differ from the current ones (in SYSCTLS order, so that
    net.ipv4.ip_forward, which also sets conf.all.forwarding, comes first)."""
    order = {n: i for i, n in enumerate(SYSCTLS)}
    names = sorted(recorded, key=lambda n: (order.get(n, len(order)), n))
    return {n: recorded[n] for n in names if n in now and _norm(now[n]) != _norm(recorded[n])}


def _norm(value: str) -> str:
    return " ".join(value.split())


def _ours(chain: str) -> bool:
    return chain.startswith(CHAIN_PREFIXES)


def iptables_cleanup(save_text: str, keep: Iterable[str] = ()) -> List[List[str]]:
    """``iptables`` argument lists that remove every KUBE-*/CNI-* chain of an
    ``iptables-save`` dump, and every rule elsewhere that jumps into one: first those rules
    (-D), then the chains' rules (-F), then the chains (-X). Chains in ``keep``
    ("table/chain", e.g. podman's CNI chains that were there before the node) stay, and so do
    the jumps into them."""
    keep = set(keep)
    cmds: List[List[str]] = []
    flush: List[List[str]] = []
    delete: List[List[str]] = []
    table = None
    for line in save_text.splitlines():
        line = line.strip()
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":") and table:
            chain = line[1:].split()[0]
            if _ours(chain) and f"{table}/{chain}" not in keep:
                flush.append(["-t", table, "-F", chain])
                delete.append(["-t", table, "-X", chain])
        elif line.startswith("-A ") and table:
            words = shlex.split(line)
            chain = words[1]
            target = _jump_target(words)
            if not _ours(chain) and target and _ours(target) and \
                    f"{table}/{target}" not in keep:
                cmds.append(["-t", table, "-D", chain, *words[2:]])
    return cmds + flush + delete


def _jump_target(words: Sequence[str]) -> Optional[str]:
    for i, w in enumerate(words[:-1]):
        if w in ("-j", "--jump", "-g", "--goto"):
            return words[i + 1]
    return None


def _unescape_mount(path: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 4 <= len(path) and path[i + 1:i + 4].isdigit():
            out.append(chr(int(path[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def mounts_under(mountinfo: str, root: Path) -> List[Path]:
    """Mount points at or below ``root`` in a /proc/self/mountinfo text, deepest (and latest)
    first: the order to unmount them in."""
    base = str(root).rstrip("/")
    found = []
    for n, line in enumerate(mountinfo.splitlines()):
        fields = line.split()
        if len(fields) < 5:
            continue
        mp = _unescape_mount(fields[4])
        if mp == base or mp.startswith(base + "/"):
            found.append((mp.count("/"), n, mp))
    return [Path(mp) for _, _, mp in sorted(found, reverse=True)]


def shim_socket_names(address: Path, namespace: str, ids: Iterable[str]) -> List[str]:
    """File names, under SHIM_SOCKET_DIR, of the sockets that containerd's shims for these
    task ids make (containerd pkg/shim SocketAddress: sha256 of address/namespace/id, and of
    the same with /debug)."""
    names = []
    for task_id in ids:
        base = f"{address}/{namespace}/{task_id}"
        for path in (base, base + "/debug"):
            names.append(hashlib.sha256(path.encode()).hexdigest())
    return names
