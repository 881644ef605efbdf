"""Leader election through a `coordination.k8s.io/v1` Lease, so two replicas never both act.

The algorithm of client-go's leaderelection, reduced to one call per cycle: read the Lease;
create it if absent; renew it if we hold it; take it over if its holder has not renewed for
`lease_duration_s`. Every update carries the `resourceVersion` that was read, so of two replicas
racing for an expired lease the API server lets exactly one win (the other gets 409). A replica
acts only while its last successful renewal is younger than the lease duration minus a safety
margin, and releases the lease on shutdown so a standby takes over at its next cycle (within
`interval_s`), not after the lease has lapsed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.kube import KubeClient, KubeError, now_rfc3339
from rlalloc.actuator.state_builder import parse_time

log = logging.getLogger(__name__)

_SAFETY = 0.8
"""Act only within this share of the lease duration after the last renewal."""


class LeaderElector:
    """Holds (or waits for) the actuator's Lease; `try_acquire` once per cycle."""

    def __init__(self, kube: KubeClient, config: ActuatorConfig, identity: str,
                 clock: Callable[[], float] = time.time) -> None:
        self._kube = kube
        self._namespace = config.lease_namespace
        self._name = config.lease_name
        self._duration_s = config.lease_duration_s
        self.identity = identity
        self._clock = clock
        self._renewed_at: float | None = None
        self.last_error: KubeError | None = None
        """Why the last `try_acquire` could not reach the Lease (None: it could; losing a race
        for it is no error), so a replica blind to the API is not taken for a standby."""

    @property
    def is_leader(self) -> bool:
        """True while our last renewal is fresh enough to act on."""
        return self.seconds_left() > 0

    def seconds_left(self) -> float:
        """How much longer our last renewal lets us act (0 when it does not): the deadline the
        moves' API calls and their retries must keep, as client-go's renew deadline does, so a
        write retried past it cannot land after a standby has taken over."""
        if self._renewed_at is None:
            return 0.0
        return max(self._renewed_at + _SAFETY * self._duration_s - self._clock(), 0.0)

    def try_acquire(self) -> bool:
        """Create, renew or take over the Lease if we may; returns `is_leader` afterwards.

        API errors leave us a follower for this cycle (never a leader by mistake).
        """
        self.last_error = None
        try:
            self._step()
        except KubeError as err:
            if err.status == 409:  # another replica wrote the Lease between our read and write
                self._lost_race()
            else:
                log.warning("leader election: %s", err)
                self.last_error = err
        return self.is_leader

    def release(self) -> None:
        """Give the Lease up (on shutdown) so a standby need not wait for it to expire."""
        if self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            lease = self._kube.read_lease(self._namespace, self._name)
            if lease and lease.get("spec", {}).get("holderIdentity") == self.identity:
                self._kube.patch_lease(self._namespace, self._name, {
                    "metadata": {"resourceVersion": lease["metadata"].get("resourceVersion")},
                    "spec": {"holderIdentity": "", "renewTime": None}})
        except KubeError as err:
            log.warning("could not release the lease: %s", err)

    def _step(self) -> None:
        # one time for what is written and what is counted from: the standbys time the lease
        # from the renewTime written, so counting it from when a (retried, slow) write returned
        # let both replicas lead at once
        started = self._clock()
        lease = self._kube.read_lease(self._namespace, self._name)
        now_text = now_rfc3339(micro=True, at=started)
        if lease is None:
            self._kube.create_lease(self._namespace, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": {"holderIdentity": self.identity,
                         "leaseDurationSeconds": max(int(self._duration_s), 1),
                         "acquireTime": now_text, "renewTime": now_text,
                         "leaseTransitions": 0}})
            self._became_leader("created", started)
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        version = lease["metadata"].get("resourceVersion")
        if holder == self.identity:
            self._kube.patch_lease(self._namespace, self._name, {
                "metadata": {"resourceVersion": version}, "spec": {"renewTime": now_text}})
            self._renewed_at = started
            return
        duration = float(spec.get("leaseDurationSeconds") or self._duration_s)
        renewed = spec.get("renewTime")
        expired = started - (parse_time(renewed) if renewed else 0.0) > duration
        if holder and not expired:
            if self._renewed_at is not None:
                log.warning("lost the lease to %s", holder)
            self._renewed_at = None
            return
        self._kube.patch_lease(self._namespace, self._name, {
            "metadata": {"resourceVersion": version},
            "spec": {"holderIdentity": self.identity, "acquireTime": now_text,
                     "renewTime": now_text, "leaseDurationSeconds": max(int(self._duration_s), 1),
                     "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1}})
        self._became_leader(f"took over from {holder or 'nobody'}", started)

    def _lost_race(self) -> None:
        """Stand by after a 409: the normal end of a race for the Lease, so no warning unless
        we held it until now."""
        was_leader = self._renewed_at is not None
        self._renewed_at = None
        if was_leader:
            log.warning("lost the lease: another replica wrote it first")
        else:
            log.info("standby: another replica took the lease first")

    def _became_leader(self, how: str, renewed_at: float) -> None:
        self._renewed_at = renewed_at
        log.info("became leader (%s) as %s", how, self.identity)
