"""The generated CRD is structural and mirrors the pydantic schema (no cluster needed)."""

import yaml

from wmrl.api import crd as crdmod
from wmrl.api.schema import WMRLRunSpec


def walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def schema():
    return crdmod.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_structural_no_refs_titles_nulls_or_free_unions():
    for path, node in walk(schema()):
        assert "$ref" not in node and "$defs" not in node, path
        assert "title" not in node or path.endswith(".properties"), path
        assert node.get("type") != "null", path
        if "anyOf" in node and path.split(".")[-1] != "properties":
            assert node.get("x-kubernetes-int-or-string") is True, path
        if "properties" in node and not path.endswith(".properties"):
            assert node.get("type") == "object", path
            assert "additionalProperties" not in node, path
        if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
            raise AssertionError(f"draft-2020 exclusiveMinimum at {path}")


def test_required_fields_and_defaults_match_pydantic():
    spec = schema()["properties"]["spec"]
    assert sorted(spec["required"]) == ["policy", "tasks"]
    assert spec["properties"]["algorithm"]["properties"]["groupSize"]["default"] == WMRLRunSpec.model_fields["algorithm"].default_factory().group_size
    assert spec["properties"]["algorithm"]["default"] == {}
    assert "default" not in spec["properties"]["policy"]
    assert spec["properties"]["mode"]["enum"] == ["wmrl", "real", "worldModel", "eval"]


def test_cel_rules_and_immutability():
    root = schema()
    rules = [r["rule"] for r in root["x-kubernetes-validations"]]
    for path, _ in crdmod.IDENTITY_FIELDS:
        assert any(path in r and "oldSelf" in r for r in rules), path
    spec = root["properties"]["spec"]["properties"]
    assert spec["sandbox"]["x-kubernetes-validations"][0]["fieldPath"] == ".minReplicas"
    assert spec["algorithm"]["properties"]["denoising"]["x-kubernetes-validations"]
    [wait] = spec["algorithm"]["x-kubernetes-validations"]
    assert wait["fieldPath"] == ".anchors.waitSeconds" and "maxTurns == 1" in wait["rule"]
    [late] = spec["algorithm"]["properties"]["anchors"]["x-kubernetes-validations"]
    assert late["fieldPath"] == ".lateRewards.enabled" and "has(self.waitSeconds)" in late["rule"]
    assert spec["algorithm"]["properties"]["maxTurns"]["maximum"] == 8
    assert spec["tasks"]["x-kubernetes-validations"]
    [scripts] = spec["policy"]["x-kubernetes-validations"]
    assert scripts["fieldPath"] == ".scripts" and "builtin:fixed-scripts" in scripts["rule"]


def test_status_subresource_printer_columns_and_progress_preserved():
    version = crdmod.crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names[:4] == ["Phase", "Mode", "Step", "Reward"] and names[-1] == "Age"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["progress"]["x-kubernetes-preserve-unknown-fields"] is True
    assert status["properties"]["conditions"]["x-kubernetes-list-type"] == "map"
    assert crdmod.crd()["spec"]["names"]["shortNames"] == ["wmr"]


def test_yaml_is_deterministic_and_parses():
    assert crdmod.crd_yaml() == crdmod.crd_yaml()
    assert yaml.safe_load(crdmod.crd_yaml())["metadata"]["name"] == "wmrlruns.wmrl.dev"
