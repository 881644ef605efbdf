"""Kubernetes Events for the actuator's decisions, with repeats folded into one Event.

A move that keeps failing (a 403 until RBAC is fixed, a PyTorchJob the API keeps refusing) is
proposed again every cycle, by design: a failed move does not start its cooldown. Creating an
Event each time buried a job's `kubectl describe` under one identical warning every 30 s. As
client-go's event recorder does, an Event that repeats one still in the cache (same object,
reason, message and type) bumps that Event's `count` and `lastTimestamp` instead; if it has
gone (Events expire after an hour by default) a new one is created.
"""

from __future__ import annotations

from collections import OrderedDict

from actuator.kube import KubeClient, KubeError

EVENTS_REMEMBERED = 4096
"""Distinct Events whose names are kept for folding repeats (oldest forgotten first)."""


class EventRecorder:
    """Records Events through `kube`, folding an exact repeat into the Event it repeats."""

    def __init__(self, kube: KubeClient, remembered: int = EVENTS_REMEMBERED) -> None:
        self._kube = kube
        self._remembered = remembered
        self._recorded: OrderedDict[tuple, tuple[str, int]] = OrderedDict()
        """(namespace, object uid and name, reason, message, type) -> (Event name, count)."""

    def record(self, namespace: str, involved: dict, reason: str, message: str,
               warning: bool, instance: str) -> None:
        """Record an Event on `involved`, or count it again on the Event it repeats; raises
        `KubeError` when the API refuses both."""
        key = (namespace, involved.get("uid"), involved["name"], reason, message, warning)
        if key in self._recorded:
            name, count = self._recorded[key]
            try:
                self._kube.count_event(namespace, name, count + 1)
                self._recorded[key] = (name, count + 1)
                self._recorded.move_to_end(key)
                return
            except KubeError as err:
                if err.status != 404:  # gone (expired, deleted): record it anew below
                    raise
                del self._recorded[key]
        name = self._kube.create_event(namespace, involved, reason, message, warning, instance)
        self._recorded[key] = (name, 1)
        while len(self._recorded) > self._remembered:
            self._recorded.popitem(last=False)
