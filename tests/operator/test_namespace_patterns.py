"""WMRL_NAMESPACES -> kopf namespace patterns, checked with kopf's own matcher."""

import pytest
from kopf._cogs.structs.references import match_namespace

from wmrl_operator.main import namespace_patterns

NAMESPACES = ["team-a", "team-b", "team-test", "kube-system", "default", "ml"]


def watched(text: str) -> list[str]:
    """What kopf serves for these patterns: a namespace any of them matches."""
    patterns = namespace_patterns(text)
    return [ns for ns in NAMESPACES if any(match_namespace(ns, pattern) for pattern in patterns)]


@pytest.mark.parametrize("text, expected", [
    ("team-a,ml", ["team-a", "ml"]),  # a list of names: each one watched
    (" team-a , , ml ", ["team-a", "ml"]),
    ("team-*,!team-test", ["team-a", "team-b"]),  # an exclusion binds to the entry before it
    ("*,!kube-system", ["team-a", "team-b", "team-test", "default", "ml"]),
    ("!kube-system,!default", ["team-a", "team-b", "team-test", "ml"]),  # first: excluded from everything
    ("team-*,!team-test,ml", ["team-a", "team-b", "ml"]),
])
def test_patterns_watch_what_they_say(text, expected):
    assert watched(text) == expected


def test_a_plain_comma_string_would_watch_one_namespace_in_kopf():
    """Why the list is split: kopf reads one comma-separated pattern as one glob that includes and
    the rest re-matching only what was excluded, and patterns in a list as alternatives."""
    assert [ns for ns in NAMESPACES if match_namespace(ns, "team-a,ml")] == ["team-a"]
    assert all(any(match_namespace(ns, p) for p in ["*", "!kube-system"]) for ns in NAMESPACES)
