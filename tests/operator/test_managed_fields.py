"""`adopted_managed_fields`: a POSTed child's fields move into the operator's Apply entry (pure)."""

from hypothesis import given, strategies as st

from wmrl_operator.kube import FIELD_MANAGER, adopted_managed_fields

trees = st.recursive(st.just({}), lambda inner: st.dictionaries(st.sampled_from(["f:a", "f:b", "f:c", "."]), inner,
                                                                  max_size=3), max_leaves=12)


def _paths(tree, prefix=()):
    """Every field path a FieldsV1 tree names."""
    out = {prefix} if prefix else set()
    for key, sub in tree.items():
        out |= _paths(sub, prefix + (key,))
    return out


def _entry(manager, operation, fields, api_version="apps/v1", **extra):
    return {"manager": manager, "operation": operation, "apiVersion": api_version,
            "fieldsType": "FieldsV1", "fieldsV1": fields, **extra}


def test_nothing_to_adopt_without_an_update_entry_of_ours():
    entries = [_entry(FIELD_MANAGER, "Apply", {"f:spec": {}}), _entry("kube-controller-manager", "Update", {"f:status": {}}),
               _entry(FIELD_MANAGER, "Update", {"f:status": {}}, subresource="status")]
    assert adopted_managed_fields(entries) is None


@given(trees, trees, trees)
def test_the_apply_entry_owns_exactly_what_either_entry_owned_and_others_keep_theirs(applied, updated, other):
    entries = [_entry(FIELD_MANAGER, "Apply", applied), _entry(FIELD_MANAGER, "Update", updated),
               _entry("someone-else", "Update", other)]
    result = adopted_managed_fields(entries)
    ours = [e for e in result if e["manager"] == FIELD_MANAGER]
    assert [e["operation"] for e in ours] == ["Apply"]
    assert _paths(ours[0]["fieldsV1"]) == _paths(applied) | _paths(updated)
    assert [e for e in result if e["manager"] != FIELD_MANAGER] == [entries[2]]


@given(trees)
def test_an_update_entry_alone_becomes_the_apply_entry(updated):
    result = adopted_managed_fields([_entry(FIELD_MANAGER, "Update", updated, time="2026-12-06T00:00:00Z")])
    assert result == [_entry(FIELD_MANAGER, "Apply", updated, time="2026-12-06T00:00:00Z")]


def test_entries_of_another_api_version_are_not_merged_into_each_other():
    entries = [_entry(FIELD_MANAGER, "Apply", {"f:a": {}}, "apps/v1"), _entry(FIELD_MANAGER, "Update", {"f:b": {}}, "apps/v2")]
    result = adopted_managed_fields(entries)
    assert sorted((e["apiVersion"], e["operation"], tuple(e["fieldsV1"])) for e in result) == [
        ("apps/v1", "Apply", ("f:a",)), ("apps/v2", "Apply", ("f:b",))]
