"""Every Kubernetes API call of the actuator, through the official `kubernetes` client.

Reads come back as plain JSON dicts (`_preload_content=False`): the state builder wants the raw
objects, and skipping the client's model classes makes listing thousands of pods several times
faster. Label and field selectors are sent to the server and applied again here, so a server
that ignores them (an emulator, an old proxy) cannot widen what the actuator touches.

Writes are retried on 409, 429 (honouring Retry-After) and 5xx, and on connection errors, with
exponential backoff and a bounded number of attempts; other errors fail at once, and the error
carries the API server's own message (a 403 says which verb on which resource was refused).
Each write is a single request, so a failed call leaves the object as it was, and each names
its field manager (`FIELD_MANAGER`), so `managedFields` tell the actuator's changes apart.
Once the actuator is stopping (`stop_retrying`) every call gets one attempt: retries against an
API that has gone would hold the exit for their whole backoff (7.5 s a call by default), while
one that is up answers the first. Inside `within(seconds_left)` (the leader's moves) no attempt
starts, and none waits for a retry, past that deadline, and each request's timeout is cut to
the time left.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.k8s_names import (
    PYTORCHJOB_CRD,
    PYTORCHJOB_GROUP,
    PYTORCHJOB_KIND,
    PYTORCHJOB_PLURAL,
    PYTORCHJOB_VERSION,
)
from rlalloc.env.errors import UserError

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({409, 429, 500, 502, 503, 504})
FIELD_MANAGER = "rlalloc-actuator"
"""The field manager every write names (`managedFields` of what the actuator changed)."""
_EXPLAINED_STATUS = frozenset({400, 403, 422})
"""Refusals whose Status message says what was refused (the request, the verb on the resource,
the field); the error carries it."""
_STATUS_MESSAGE_CHARS = 300
_MIN_TIMEOUT_S = 0.001
_TERMINAL = ("Succeeded", "Failed")


class KubeError(Exception):
    """A Kubernetes API call failed (after its retries); `status` is the HTTP status or 0."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def api_client_from(config: ActuatorConfig) -> k8s.ApiClient:
    """An API client from the in-cluster service account or a kubeconfig (see `kubeconfig`)."""
    configuration = k8s.Configuration()
    try:
        if config.kubeconfig:
            _load_kubeconfig_file(Path(config.kubeconfig), config.kube_context, configuration)
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except ConfigException:
                k8s_config.load_kube_config(context=config.kube_context or None,
                                            client_configuration=configuration)
    except (ConfigException, OSError) as err:
        raise UserError(f"cannot configure the Kubernetes client ({err}); run in a pod with a "
                        "service account or pass --kubeconfig") from err
    configuration.retries = 0  # retries are ours, with backoff (see KubeClient._call)
    return k8s.ApiClient(configuration)


def _load_kubeconfig_file(path: Path, context: str, configuration: k8s.Configuration) -> None:
    """Configure the client from the kubeconfig at `path`. A missing file, or one that is not a
    usable kubeconfig (another file passed by mistake, broken YAML, no such context), is a
    `UserError` naming it: the client itself raises a bare type or YAML scanner error."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "no such file"
        raise UserError(f"kubeconfig {path}: {what}; pass the kubeconfig kubectl uses with "
                        "--kubeconfig (or the kubeconfig setting)")
    try:
        k8s_config.load_kube_config(str(path), context=context or None,
                                    client_configuration=configuration)
    except (ConfigException, OSError, yaml.YAMLError, TypeError, AttributeError, KeyError,
            ValueError) as err:
        problem = " ".join(line.strip() for line in str(err).splitlines())[:200]
        raise UserError(f"kubeconfig {path}: not usable ({problem or type(err).__name__}); "
                        "pass the file kubectl uses (kubectl config view --raw > FILE)") from err
    if not str(configuration.host or "").startswith(("http://", "https://")):
        # the client takes a missing or scheme-less server as is; every call would then fail
        # (retried, with a urllib3 warning) instead of the start-up naming the file
        raise UserError(f"kubeconfig {path}: the cluster's server is {configuration.host!r}, "
                        "not an http:// or https:// URL; set clusters[].cluster.server to the "
                        "API server's address (kubectl config view --raw > FILE)")


def now_rfc3339(micro: bool = False, at: float | None = None) -> str:
    """The current time (or unix time `at`) as Kubernetes writes it (MicroTime when `micro`)."""
    now = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def has_labels(obj: dict, selector: dict[str, str]) -> bool:
    """True when `obj` carries every label of `selector` with the same value."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


class KubeClient:
    """The reads and writes the actuator makes; see the module docstring for the retry policy."""

    def __init__(self, config: ActuatorConfig, api_client: k8s.ApiClient,
                 sleep: Callable[[float], object] | None = None) -> None:
        """`sleep`: how to wait between attempts (default: a wait that `stop_retrying` ends
        at once)."""
        self._config = config
        self._core = k8s.CoreV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._coordination = k8s.CoordinationV1Api(api_client)
        self._apiextensions = k8s.ApiextensionsV1Api(api_client)
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self.server_url: str = api_client.configuration.host
        """The API server's address (for errors that tell what could not be reached)."""
        self.retries_done = 0
        """Retries made so far (exported as a metric)."""
        self._seconds_left: Callable[[], float] | None = None

    @contextmanager
    def within(self, seconds_left: Callable[[], float] | None) -> Iterator[None]:
        """Bound every call in the block by a deadline (`seconds_left()`; None: no bound): the
        leader's lease margin, so no move is written, nor retried, after a standby may lead."""
        outer, self._seconds_left = self._seconds_left, seconds_left
        try:
            yield
        finally:
            self._seconds_left = outer

    def stop_retrying(self) -> None:
        """Give every call from now on (and the one under way) one attempt more at most, so a
        shutdown is prompt when the API has gone (see the module docstring); safe from a
        signal handler or another thread."""
        self._stopping.set()

    # ------------------------------------------------------------------------------- reads
    def list_nodes(self) -> list[dict]:
        """All nodes."""
        return self._items(lambda: self._core.list_node(**self._raw()), "list nodes")

    def list_pods(self) -> list[dict]:
        """Pods of every namespace that are not finished (they hold GPUs, managed or not)."""
        items = self._items(lambda: self._core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed", **self._raw()),
            "list pods")
        return [p for p in items if (p.get("status") or {}).get("phase") not in _TERMINAL]

    def list_pytorchjobs(self) -> list[dict]:
        """PyTorchJobs carrying the opt-in label, in the configured namespaces."""
        selector = {self._config.managed_label: "true"}
        label_selector = f"{self._config.managed_label}=true"
        if self._config.namespaces:
            items = []
            for namespace in self._config.namespaces:
                items += self._items(
                    lambda ns=namespace: self._custom.list_namespaced_custom_object(
                        PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, ns, PYTORCHJOB_PLURAL,
                        label_selector=label_selector, **self._raw()),
                    f"list pytorchjobs in {namespace}")
        else:
            items = self._items(lambda: self._custom.list_cluster_custom_object(
                PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL,
                label_selector=label_selector, **self._raw()), "list pytorchjobs")
        return [job for job in items if has_labels(job, selector)]

    def read_pytorchjob_crd(self) -> dict:
        """The PyTorchJob CustomResourceDefinition installed in the cluster, as a dict: what
        the API server checks PyTorchJobs against. Raises `KubeError` (403: no RBAC to read
        it, 404: not installed)."""
        what = f"read customresourcedefinition {PYTORCHJOB_CRD}"
        response = self._call(lambda: self._apiextensions.read_custom_resource_definition(
            PYTORCHJOB_CRD, **self._raw()), what)
        try:
            return json.loads(response.data)
        except ValueError as err:
            raise KubeError(f"{what}: the answer is not JSON; is this a Kubernetes API "
                            "server?") from err

    # ------------------------------------------------------------------------------ writes
    def patch_pytorchjob(self, namespace: str, name: str, patch: dict) -> None:
        """JSON merge patch of a PyTorchJob (one request: all of it applies or none); a field
        the CRD does not know is refused (`fieldValidation=Strict`), not silently dropped."""
        self._call(lambda: self._custom.patch_namespaced_custom_object(
            PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, namespace, PYTORCHJOB_PLURAL, name, patch,
            field_validation="Strict", field_manager=FIELD_MANAGER,
            _request_timeout=self._timeout()),
            f"patch pytorchjob {namespace}/{name}")

    def scale_pytorchjob(self, namespace: str, name: str, replicas: int) -> None:
        """Set the worker count through the PyTorchJob's /scale subresource (strict field
        validation, as `patch_pytorchjob`)."""
        self._call(lambda: self._custom.patch_namespaced_custom_object_scale(
            PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, namespace, PYTORCHJOB_PLURAL, name,
            {"spec": {"replicas": replicas}}, field_validation="Strict",
            field_manager=FIELD_MANAGER, _request_timeout=self._timeout()),
            f"scale pytorchjob {namespace}/{name}")

    def cordon(self, node: str) -> None:
        """Mark `node` unschedulable."""
        self._call(lambda: self._core.patch_node(
            node, {"spec": {"unschedulable": True}}, field_manager=FIELD_MANAGER,
            _request_timeout=self._timeout()), f"cordon node {node}")

    def uncordon(self, node: str) -> None:
        """Mark `node` schedulable again (a rolled-back move's cordon)."""
        self._call(lambda: self._core.patch_node(
            node, {"spec": {"unschedulable": False}}, field_manager=FIELD_MANAGER,
            _request_timeout=self._timeout()), f"uncordon node {node}")

    def delete_pod(self, namespace: str, name: str, grace_s: int, uid: str = "") -> bool:
        """Delete a pod; False when it was gone already (404), or, with `uid`, when the pod of
        that name is another one (409): the operator recreates a deleted worker under the same
        name, so a retry of a delete whose answer was lost killed the replacement. Either answer
        to a retry of an attempt that got no answer is True: that attempt deleted it (its
        answer was lost: no answer, or a 5xx, which the API server may answer after it
        committed the delete), which the caller counts as a disruption."""
        options = k8s.V1DeleteOptions(grace_period_seconds=grace_s, preconditions=(
            k8s.V1Preconditions(uid=uid) if uid else None))
        unanswered = False

        def delete() -> Any:
            nonlocal unanswered
            try:
                return self._core.delete_namespaced_pod(
                    name, namespace, body=options, _request_timeout=self._timeout())
            except ApiException as err:
                unanswered |= int(err.status or 0) >= 500
                raise
            except (urllib3.exceptions.HTTPError, OSError):
                unanswered = True
                raise

        try:
            self._call(delete, f"delete pod {namespace}/{name}", retry_conflict=False)
        except KubeError as err:
            if err.status not in (404, 409):
                raise
            return unanswered
        return True

    def create_event(self, namespace: str, involved: dict, reason: str, message: str,
                     warning: bool, instance: str) -> str:
        """Record a Kubernetes Event on `involved` (apiVersion/kind/name/namespace/uid) and
        return its name."""
        now = now_rfc3339()
        name = f"{involved['name']}.{time.time_ns():x}"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved, "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self._config.event_component, "host": instance},
            "reportingComponent": self._config.event_component, "reportingInstance": instance,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        self._call(lambda: self._core.create_namespaced_event(
            namespace, body, field_manager=FIELD_MANAGER, _request_timeout=self._timeout()),
            f"create event on {involved['name']}")
        return name

    def count_event(self, namespace: str, name: str, count: int, message: str) -> None:
        """Set an Event's `count` (it happened again), its `message` to the latest and its
        `lastTimestamp` to now; raises `KubeError` (404 when the Event has gone)."""
        patch = {"count": count, "message": message[:1024], "lastTimestamp": now_rfc3339()}
        self._call(lambda: self._core.patch_namespaced_event(
            name, namespace, patch, field_manager=FIELD_MANAGER,
            _request_timeout=self._timeout()),
            f"count event {namespace}/{name}")

    # ------------------------------------------------------------------------------ leases
    def read_lease(self, namespace: str, name: str) -> dict | None:
        """The Lease as a dict, or None when it does not exist."""
        try:
            response = self._call(lambda: self._coordination.read_namespaced_lease(
                name, namespace, **self._raw()), f"read lease {namespace}/{name}")
        except KubeError as err:
            if err.status == 404:
                return None
            raise
        return json.loads(response.data)

    def create_lease(self, namespace: str, body: dict) -> None:
        """Create a Lease; raises `KubeError` with status 409 when it already exists."""
        self._call(lambda: self._coordination.create_namespaced_lease(
            namespace, body, field_manager=FIELD_MANAGER, _request_timeout=self._timeout()),
            f"create lease {namespace}", retry_conflict=False)

    def patch_lease(self, namespace: str, name: str, patch: dict) -> None:
        """Patch a Lease; a `metadata.resourceVersion` in `patch` makes it conditional (409 when
        another replica changed it first, which is not retried)."""
        self._call(lambda: self._coordination.patch_namespaced_lease(
            name, namespace, patch, field_manager=FIELD_MANAGER,
            _request_timeout=self._timeout()),
            f"patch lease {namespace}/{name}", retry_conflict=False)

    # ----------------------------------------------------------------------------- helpers
    def _raw(self) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self._timeout()}

    def _left(self) -> float:
        return float("inf") if self._seconds_left is None else self._seconds_left()

    def _timeout(self) -> float:
        """A request's timeout: the configured one, cut to the deadline of `within`, and never
        0, which the client takes for no timeout at all (a deadline that passed since the
        attempt began then times the request out at once)."""
        return max(min(self._config.api_timeout_s, self._left()), _MIN_TIMEOUT_S)

    def _items(self, fn: Callable[[], Any], what: str) -> list[dict]:
        return json.loads(self._call(fn, what).data).get("items") or []

    def _call(self, fn: Callable[[], Any], what: str, retry_conflict: bool = True) -> Any:
        """Run `fn`, retrying retryable failures with exponential backoff."""
        attempts = self._config.api_retries + 1
        delay = self._config.api_backoff_s
        for attempt in range(attempts):
            if self._left() <= 0:
                raise KubeError(f"{what}: not sent, the lease margin ran out"
                                + (f" after {attempt} attempts" if attempt else ""))
            try:
                return fn()
            except ApiException as err:
                status = int(err.status or 0)
                wait = max(delay, _retry_after(err))
                retryable = status in RETRYABLE_STATUS and (status != 409 or retry_conflict)
                last = self._no_retry(attempt, attempts, wait) if retryable else ""
                if last is not None:
                    raise KubeError(f"{what}: HTTP {status} {err.reason or ''}".strip()
                                    + (_status_message(err) if status in _EXPLAINED_STATUS
                                       else "")
                                    + (f" after {attempt + 1} attempts" if attempt else "")
                                    + last, status) from err
            except (urllib3.exceptions.HTTPError, OSError) as err:
                wait = delay
                last = self._no_retry(attempt, attempts, wait)
                if last is not None:
                    raise KubeError(f"{what}: {_unanswered(err)} after {attempt + 1} "
                                    f"attempt{'s' if attempt else ''}{last}") from err
            log.debug("retrying %s in %.2fs", what, wait)
            self.retries_done += 1
            self._sleep(wait)
            delay *= 2
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _no_retry(self, attempt: int, attempts: int, wait: float) -> str | None:
        """None when a retryable failure is tried again after `wait`; else what to add to the
        error: nothing when no attempt is left or the actuator is stopping, a note when the
        retry would wait past the deadline of `within` (the lease margin)."""
        if attempt == attempts - 1 or self._stopping.is_set():
            return ""
        return " (not retried: the lease margin ends first)" if wait >= self._left() else None


def _unanswered(err: Exception) -> str:
    """Why a request got no answer, in one line: urllib3 wraps a refused connection, a failed
    name lookup or a TLS mismatch in a MaxRetryError whose name alone says none of that, so
    name the reason inside it."""
    reason = getattr(err, "reason", None)
    cause = reason if isinstance(reason, BaseException) else err
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0][:200]}" if lines else type(cause).__name__


def _status_message(err: ApiException) -> str:
    """": " and the API server's own words for a refusal, the `message` of the Status it
    answered with (a 403 names the user, the verb and the resource; a 422 the invalid field),
    or "" when the body is no Status: the reason phrase alone ("Forbidden") says neither."""
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message.strip():
        return ""
    return ": " + " ".join(message.split())[:_STATUS_MESSAGE_CHARS]


def _retry_after(err: ApiException) -> float:
    headers = err.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0


def involved_pytorchjob(namespace: str, name: str, uid: str) -> dict:
    """The `involvedObject` of an Event about a PyTorchJob."""
    return {"apiVersion": f"{PYTORCHJOB_GROUP}/{PYTORCHJOB_VERSION}", "kind": PYTORCHJOB_KIND,
            "name": name, "namespace": namespace, "uid": uid}
