"""The Event the operator posts about a run (pure; the cluster tests check they arrive)."""

import datetime as dt

from wmrl_operator.events import MESSAGE_LIMIT, event_for

BODY = {"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun",
        "metadata": {"name": "r1", "namespace": "ns", "uid": "u-1", "resourceVersion": "42"}}


def test_event_points_at_the_run_and_carries_reason_type_and_time():
    now = dt.datetime(2026, 12, 3, 8, 30, 5, 123456, tzinfo=dt.timezone.utc)
    event = event_for(BODY, "Warning", "DeadlineExceeded", "too slow", now, instance="op-0")
    assert event["metadata"] == {"generateName": "r1.", "namespace": "ns"}
    assert event["involvedObject"] == {"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "name": "r1",
                                       "namespace": "ns", "uid": "u-1", "resourceVersion": "42"}
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "DeadlineExceeded", "too slow")
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-12-03T08:30:05Z"
    assert event["source"] == {"component": "wmrl-operator"} and event["reportingInstance"] == "op-0"


def test_long_messages_are_cut_to_what_the_apiserver_accepts():
    event = event_for(BODY, "Normal", "X", "m" * 5000, dt.datetime.now(dt.timezone.utc))
    assert len(event["message"]) == MESSAGE_LIMIT
