"""Kubernetes Events for the actuator's decisions, with repeats folded into one Event.

A move that keeps failing (a 403 until RBAC is fixed, a PyTorchJob the API keeps refusing) is
tried again after each backoff until it is given up (`failed_moves`), and a refusal may repeat
every cycle. Creating an Event each time buried a job's `kubectl describe` under one identical
warning every 30 s. As client-go's event recorder does, an Event that repeats one still in the
cache (same object, reason, type and message, or for a refusal the same action and guardrail)
bumps that Event's `count`, `message` and `lastTimestamp` instead; if it cannot (Events expire
after an hour by default) a new one is created.
"""

from __future__ import annotations

from collections import OrderedDict

from rlalloc.actuator.kube import KubeClient, KubeError

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
               warning: bool, instance: str, repeat_key: str | None = None) -> None:
        """Record an Event on `involved`, or count it again, with this `message`, on the Event
        it repeats. What makes a repeat is `repeat_key` (default: the message): a refusal's
        message carries figures that change every cycle ("changed 31s ago"), so the loop keys
        it by its action and guardrail. If counting fails for any reason (gone: 404; a Role
        without `patch` on events, left from before this version: 403), a new Event is made;
        raises `KubeError` only when that fails too."""
        key = (namespace, involved.get("uid"), involved["name"], reason,
               message if repeat_key is None else repeat_key, warning)
        if key in self._recorded:
            name, count = self._recorded.pop(key)
            try:
                self._kube.count_event(namespace, name, count + 1, message)
                self._recorded[key] = (name, count + 1)
                return
            except KubeError:
                pass  # record it anew below
        name = self._kube.create_event(namespace, involved, reason, message, warning, instance)
        self._recorded[key] = (name, 1)
        while len(self._recorded) > self._remembered:
            self._recorded.popitem(last=False)
