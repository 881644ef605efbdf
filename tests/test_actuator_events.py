"""`EventRecorder`: repeats fold into one Event; what makes a repeat; what happens when the
Event cannot be counted again."""

from __future__ import annotations

import pytest

from rlalloc.actuator.events import EventRecorder
from rlalloc.actuator.kube import KubeError

JOB = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "a", "namespace": "d",
       "uid": "u-1"}


class RecordingKube:
    """The two calls `EventRecorder` makes; `count_status` makes `count_event` fail."""

    def __init__(self, count_status: int = 0) -> None:
        self.events: dict[str, dict] = {}
        self.count_status = count_status

    def create_event(self, namespace: str, involved: dict, reason: str, message: str,
                     warning: bool, instance: str) -> str:
        name = f"a.{len(self.events)}"
        self.events[name] = {"reason": reason, "message": message, "count": 1}
        return name

    def count_event(self, namespace: str, name: str, count: int, message: str) -> None:
        if self.count_status:
            raise KubeError("patch event: HTTP", self.count_status)
        self.events[name].update(count=count, message=message)


def test_a_refusal_whose_figures_change_folds_by_its_key_and_keeps_the_latest_message():
    kube = RecordingKube()
    recorder = EventRecorder(kube)
    for seconds in (31, 61, 91):
        recorder.record("d", JOB, "ActionRefused", f"scale: cooldown: changed {seconds}s ago",
                        True, "a-0", repeat_key="scale: cooldown")
    assert list(kube.events.values()) == [
        {"reason": "ActionRefused", "message": "scale: cooldown: changed 91s ago", "count": 3}]
    recorder.record("d", JOB, "ActionRefused", "scale: needs 2, 1 free", True, "a-0",
                    repeat_key="scale: free GPUs")
    assert len(kube.events) == 2  # another guardrail is another Event


@pytest.mark.parametrize("status", [403, 404, 500])
def test_an_event_that_cannot_be_counted_again_is_recorded_anew(status):
    # 403: a Role from before this version grants events create but not patch
    kube = RecordingKube(count_status=status)
    recorder = EventRecorder(kube)
    for _ in range(3):
        recorder.record("d", JOB, "ActionFailed", "scale: HTTP 403", True, "a-0")
    assert [e["count"] for e in kube.events.values()] == [1, 1, 1]


def test_the_oldest_events_are_forgotten_first():
    kube = RecordingKube()
    recorder = EventRecorder(kube, remembered=2)
    for message in ("m1", "m2", "m1", "m3", "m2"):  # m1 used again: m2 is the oldest then
        recorder.record("d", JOB, "Scaled", message, False, "a-0")
    assert sorted((e["message"], e["count"]) for e in kube.events.values()) == [
        ("m1", 2), ("m2", 1), ("m2", 1), ("m3", 1)]
