"""The generated files (CRD copies, chart RBAC rules, install.yaml, docs/api.md) match their sources."""

import subprocess
import sys
from pathlib import Path

import yaml

from wmrl.api import generate
from wmrl.api.crd import crd_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_up_to_date():
    stale = generate.stale()
    assert not stale, f"stale generated files {[str(p) for p in stale]}: run `make generate`"


def test_crd_copies_equal_wmrl_crd_output():
    printed = subprocess.run([sys.executable, "-m", "wmrl.cli", "crd"], check=True, capture_output=True,
                             text=True).stdout
    assert printed == crd_yaml()
    for rel in ("manifests/crds/wmrl.dev_wmrlruns.yaml", "helm/wmrl-operator/crds/wmrl.dev_wmrlruns.yaml"):
        assert (ROOT / rel).read_text() == printed, rel


def test_check_names_the_stale_file_and_write_repairs_it(tmp_path):
    cmd = [sys.executable, "-m", "wmrl.api.generate", "--root", str(tmp_path)]
    assert subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.count("wrote ") == len(generate.outputs())
    assert subprocess.run(cmd + ["--check"], capture_output=True).returncode == 0

    drifted = tmp_path / "docs" / "api.md"
    drifted.write_text(drifted.read_text() + "hand edit\n")
    res = subprocess.run(cmd + ["--check"], capture_output=True, text=True)
    assert res.returncode == 1
    assert "stale: docs/api.md" in res.stderr
    assert "install.yaml" not in res.stderr

    assert subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip() == "wrote docs/api.md"
    assert generate.stale(tmp_path) == []


def test_install_yaml_holds_crd_rbac_and_two_leader_elected_operators():
    from wmrl_operator.rbac import lease_rules

    docs = list(yaml.safe_load_all((ROOT / "manifests/install.yaml").read_text()))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                     "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"]
    deployment = docs[-1]
    assert deployment["metadata"]["namespace"] == "wmrl-system"
    assert deployment["spec"]["replicas"] == 2  # one active, one standby, through the Lease
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    lease_role = docs[5]
    assert lease_role["metadata"]["namespace"] == "wmrl-system" and lease_role["rules"] == lease_rules("wmrl-operator")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["args"][:2] == ["operator", "--all-namespaces"]
    assert {"--leader-elect", "--lease-namespace=wmrl-system", "--lease-name=wmrl-operator"} <= set(container["args"])
    rules = generate.rbac_rules()
    assert docs[3]["rules"] == rules["cluster"] + rules["namespaced"]


def test_api_reference_lists_every_spec_field():
    text = (ROOT / "docs/api.md").read_text()
    schema = yaml.safe_load(crd_yaml())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def paths(node, prefix):
        for key, child in (node.get("properties") or {}).items():
            yield f"{prefix}.{key}"
            yield from paths(child, f"{prefix}.{key}")

    missing = [p for p in paths(schema["properties"]["spec"], "spec") if f"`{p}`" not in text]
    assert not missing
    assert "| `spec.algorithm.groupSize` | integer | `8` | >= 2; <= 1024 |" in text


def test_install_yaml_args_are_what_wmrl_operator_accepts():
    """The Deployment's command line parses with the operator's own argument parser."""
    import argparse

    from wmrl_operator.main import add_arguments

    deployment = list(yaml.safe_load_all((ROOT / "manifests/install.yaml").read_text()))[-1]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] + container["args"][:1] == ["wmrl", "operator"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    assert args.all_namespaces and args.standalone
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (args.health_port, args.metrics_port) == (ports["health"], ports["metrics"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
