"""The twin's Kubernetes API: kmock's `KubernetesEmulator` served over real HTTP, plus what a real
API server does that the emulator does not (and the actuator relies on).

kmock stores objects, serves list/get/create/patch/delete and keeps a request log (here bounded
to the latest `requests_kept`: kmock's grows with every request), but treats every path the
same way. This subclass adds, before the emulator touches its store:

- the PyTorchJob `/scale` subresource (GET returns an `autoscaling/v1` Scale; PATCH sets
  `spec.pytorchReplicaSpecs.Worker.replicas`, as the CRD's `specReplicasPath` says) — without it
  the emulator would merge `{"spec": {"replicas": n}}` into the job itself;
- `metadata.resourceVersion` on every write, and the optimistic-concurrency check of a patch that
  carries one (409 Conflict), which leader election depends on;
- `uid` and `creationTimestamp` on create, and a delete's uid precondition (409 Conflict when
  the object of that name is another one, as the operator's replacement of a deleted pod is);
- the Training Operator's PyTorchJob CRD, installed: served as
  `customresourcedefinitions/pytorchjobs.kubeflow.org` (the file shipped in `twin/crds/`), and
  every PyTorchJob written is validated, as it would be stored, against its schema (422
  Invalid, nothing stored) — the API server's job; a field the schema does not know is refused
  too, as the API server does under `fieldValidation=Strict` (which the actuator always sends;
  the twin takes the parameter and prunes nothing);
- injected faults (`inject_fault`): the next matching requests are answered with the given
  statuses without touching the store, like a real overloaded or flaky API server, at once or
  held past the client's timeout (a request lost on its way); lost responses
  (`inject_lost_response`): the next matching requests are carried out, the write lands in the
  store, but the answer the client gets is an error, or none in time, so it cannot tell that
  it landed (a connection cut after the API server committed). `faults_served` counts both as
  they are given, `clear_faults` ends those not served yet;
- discovery and lists shaped as the API server writes them, so kubectl and typed clients read
  them: the core group's `groupVersion` is "v1" (kmock writes "/v1", and kubectl then finds no
  core resource), each resource has its singular and short names, and a list carries its `kind`
  ("PodList") and `apiVersion`;
- Tables for `kubectl get` (`actuator/twin/tables.py`): the columns the API server's printers
  write (a pod's STATUS and NODE among them), with ages on the twin's clock (`clock_s`), which
  also stamps `creationTimestamp`, so a PyTorchJob (created at its simulated submit time) and
  its pods age alike.

Label and field selectors are still ignored (the actuator filters again on its side).
`ApiServerThread` runs the server and the twin's own code in one event loop thread, so the twin's
writes and the HTTP handlers never interleave mid-update.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock import KubernetesEmulator, Server, action

from rlalloc.actuator.apply import merge_patch
from rlalloc.actuator.crd_schema import (
    PyTorchJobValidationError,
    PyTorchJobValidator,
    crd_from_file,
)
from rlalloc.actuator.k8s_names import (
    PYTORCHJOB_CRD,
    PYTORCHJOB_GROUP,
    PYTORCHJOB_PLURAL,
    PYTORCHJOB_VERSION,
)
from rlalloc.actuator.twin.tables import as_table, wants_table

log = logging.getLogger(__name__)

PODS = kmock.resource("", "v1", "pods")
NODES = kmock.resource("", "v1", "nodes")
EVENTS = kmock.resource("", "v1", "events")
LEASES = kmock.resource("coordination.k8s.io", "v1", "leases")
PYTORCHJOBS = kmock.resource(PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL)
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
_SERVED = {PODS: ("Pod", True, {"po"}), NODES: ("Node", False, {"no"}),
           EVENTS: ("Event", True, {"ev"}), LEASES: ("Lease", True, set()),
           PYTORCHJOBS: ("PyTorchJob", True, set()),
           CRDS: ("CustomResourceDefinition", False, {"crd", "crds"})}
"""Each served resource's kind, whether it is namespaced and its short names (as kubectl
knows them from a real API server's discovery)."""
_HISTORY_KEPT = 2
"""Versions of each object kept (the emulator keeps all of them; a long demo would grow)."""
INSTALLED_CRD_FILE = Path(str(files("rlalloc.actuator") / "twin" / "crds"
                              / "kubeflow.org_pytorchjobs.v1.9.0.yaml"))
"""The PyTorchJob CRD the twin has installed (shipped as package data)."""
REQUESTS_KEPT = 10_000
"""Requests kept in the log (kmock keeps every one, with no setting to stop it, and a twin
demo serving the actuator and kubectl for hours would grow without end); a test's requests
fit many times over."""


@dataclass
class _Fault:
    method: str
    path_contains: str
    statuses: list[int]
    retry_after_s: int
    hold_s: float = 0.0
    """How long the answer is held before it is sent."""
    lost_response: bool = False
    """The request is carried out first and only its answer replaced (`inject_lost_response`)."""

    def served(self) -> str:
        """What the client gets this time, for `TwinKubeAPI.faults_served`."""
        what = f"HTTP {self.statuses[0]}" + (f" held {self.hold_s:g} s" if self.hold_s else "")
        return f"lost response ({what})" if self.lost_response else what

    def matches(self, request: kmock.Request) -> bool:
        """Whether `request` is one this fault is waiting for."""
        return (self.method in ("*", str(request.method.value).upper())
                and self.path_contains in request.url.path and bool(self.statuses))


@attrs.define(kw_only=True)
class TwinKubeAPI(KubernetesEmulator):
    """`KubernetesEmulator` with the additions listed in the module docstring."""

    _version: int = attrs.field(default=0, init=False)
    _faults: list[_Fault] = attrs.field(factory=list, init=False)
    _faults_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    faults_served: Counter[tuple[str, str, str]] = attrs.field(factory=Counter, init=False)
    """Injected answers given so far, by (method, path of the request, what it got: "HTTP
    503", "HTTP 504 held 0.5 s", "lost response (HTTP 504)"), counted as they are taken: a
    held answer whose client gave up is counted too."""
    clock_s: Callable[[], float] = attrs.field(default=time.time)
    """The API server's clock (Unix seconds): the wall clock, or the twin's (`Twin` sets it)."""
    requests_kept: int = REQUESTS_KEPT
    """The request log (iterating the emulator) holds the latest this many requests."""
    _validate: PyTorchJobValidator = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for resource, (kind, namespaced, short_names) in _SERVED.items():
            self.resources[resource] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, singular=kind.lower(), shortnames=short_names,
                subresources={"scale", "status"} if resource == PYTORCHJOBS else set(),
                verbs={"get", "list", "watch", "create", "patch", "delete"})
        crd = installed_crd()
        self.put(CRDS, None, PYTORCHJOB_CRD, crd)
        self._validate = PyTorchJobValidator(crd, f"the twin's CRD {PYTORCHJOB_CRD}")

    # ------------------------------------------------------------------- test & twin API
    def inject_fault(self, method: str, path_contains: str, *statuses: int,
                     retry_after_s: int = 0, hold_s: float = 0.0) -> None:
        """Answer the next ``len(statuses)`` requests whose method is `method` ("*" = any) and
        whose path contains `path_contains` with these HTTP statuses, in order, without
        touching the store. `hold_s`: each answer is held that long first; longer than the
        client's request timeout, the client sees a timeout (a request lost on its way)."""
        with self._faults_lock:
            self._faults.append(_Fault(method.upper(), path_contains, list(statuses),
                                       retry_after_s, hold_s))

    def inject_lost_response(self, method: str, path_contains: str, count: int = 1,
                             status: int = 504, hold_s: float = 0.0) -> None:
        """Carry out the next `count` requests matching as in `inject_fault` (a write lands in
        the store), but answer each with `status` instead (504, as an API server does when its
        storage outlived the request's deadline), held `hold_s` first (longer than the client's
        request timeout: the client sees a timeout). The client cannot tell that the write
        landed: what a connection cut after the API server committed looks like."""
        with self._faults_lock:
            self._faults.append(_Fault(method.upper(), path_contains, [status] * count, 0,
                                       hold_s, lost_response=True))

    def clear_faults(self) -> None:
        """Forget every injected fault not served yet: the API server is well again (a
        permission restored, an overload over)."""
        with self._faults_lock:
            self._faults.clear()

    def get(self, resource: kmock.resource, namespace: str | None, name: str) -> dict | None:
        """A deep copy of the stored object, or None (call from the server's thread)."""
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def list(self, resource: kmock.resource) -> list[dict]:
        """Deep copies of every live object of `resource` (call from the server's thread)."""
        return [copy.deepcopy(obj.raw) for (res, _, _), obj in self.objects.items()
                if res == resource and not obj.deleted]

    def put(self, resource: kmock.resource, namespace: str | None, name: str,
            obj: dict) -> None:
        """Create or replace an object (the twin's own writes), keeping server-set metadata."""
        key = (resource, namespace, name)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        old = self.get(resource, namespace, name)
        if old is not None:
            for field in ("uid", "creationTimestamp"):
                if field in old["metadata"]:
                    meta.setdefault(field, old["metadata"][field])
        self._stamp(meta, creating=old is None)
        if key in self.objects and not self.objects[key].deleted:
            self.objects[key].history.append(obj)
            del self.objects[key].history[:-_HISTORY_KEPT]
        else:
            self.objects[key] = obj

    def patch(self, resource: kmock.resource, namespace: str | None, name: str,
              patch: dict) -> None:
        """Merge-patch an existing object (the twin's own writes)."""
        current = self.get(resource, namespace, name)
        if current is not None:
            self.put(resource, namespace, name, merge_patch(current, patch))

    def remove(self, resource: kmock.resource, namespace: str | None, name: str) -> None:
        """Delete an object (the twin's own writes; no-op if it is gone)."""
        key = (resource, namespace, name)
        if key in self.objects:
            del self.objects[key]

    # ------------------------------------------------------------------------ HTTP side
    async def _serve_version(self, request: kmock.Request) -> dict[str, Any]:
        """kmock's `APIResourceList`, with the `groupVersion` the API server writes."""
        document = await super()._serve_version(request)
        document["groupVersion"] = _api_version(request.resource)
        return document

    async def _serve_list(self, request: kmock.Request) -> dict[str, Any]:
        """kmock's list, with the `kind`, `apiVersion` and `resourceVersion` of a real one."""
        listing = await super()._serve_list(request)
        kind = self.resources[request.resource].kind
        if _wants_table(request):
            return self._table(request, kind, listing["items"])
        return {"apiVersion": _api_version(request.resource), "kind": f"{kind}List",
                "metadata": {"resourceVersion": str(self._version)}, "items": listing["items"]}

    async def _serve_fetch(self, request: kmock.Request) -> dict[str, Any]:
        """kmock's object, or its Table row when kubectl asks for one (`kubectl get pod x`)."""
        obj = await super()._serve_fetch(request)
        if _wants_table(request):
            return self._table(request, self.resources[request.resource].kind, [obj])
        return obj

    def _table(self, request: kmock.Request, kind: str, objects: list[dict]) -> dict[str, Any]:
        """`objects` as the Table kubectl prints, stamped with the current resourceVersion."""
        table = as_table(kind, objects, self.clock_s(),
                         request.params.get("includeObject", "Metadata"), time.time())
        table["metadata"]["resourceVersion"] = str(self._version)
        return table

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        self._forget_old_requests()
        taken = self._take_fault(request)
        if taken is None:
            return await self._serve(request)
        fault, status = taken
        if fault.lost_response:
            await self._serve(request)  # the write lands; its answer does not
        if fault.hold_s:
            await asyncio.sleep(fault.hold_s)
        headers = {"Retry-After": str(fault.retry_after_s)} if fault.retry_after_s else None
        if fault.lost_response:
            return _status(status, "Timeout", "injected lost response: the request was carried "
                           "out, its answer lost", headers)
        return _status(status, "InjectedFault", f"injected HTTP {status}", headers)

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Answer `request` as the API server would (the additions of the module docstring)."""
        if request.resource == PYTORCHJOBS and request.subresource == "scale":
            return self._scale(request)
        if request.resource is not None and request.subresource is None:
            refusal = self._check_write(request)
            if refusal is not None:
                return refusal
        response = await super()._handle(request)
        if request.action in (action.UPDATE, action.CREATE) and request.resource is not None:
            self._trim(request)
        return response

    def _forget_old_requests(self) -> None:
        """Cut the request logs to the latest `requests_kept`: kmock's root log and each of its
        reactions' (one per kind of request the emulator serves) keep every request, held with
        aiohttp's request and protocol objects, and it has no setting to stop that."""
        for kept in (self._requests, *(reaction._requests for reaction in self._payloads)):
            del kept[:-self.requests_kept]

    def _take_fault(self, request: kmock.Request) -> tuple[_Fault, int] | None:
        """The injected fault waiting for `request`, if any, and the status it answers with
        this time (counted in `faults_served`)."""
        with self._faults_lock:
            for fault in self._faults:
                if fault.matches(request):
                    self.faults_served[(str(request.method.value).upper(), request.url.path,
                                        fault.served())] += 1
                    status = fault.statuses.pop(0)
                    if not fault.statuses:
                        self._faults.remove(fault)
                    return fault, status
        return None

    def _check_write(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        """Stamp metadata, enforce resourceVersion and (on a delete) uid preconditions,
        validate PyTorchJobs."""
        if request.action == action.DELETE and isinstance(request.data, dict):
            wanted = (request.data.get("preconditions") or {}).get("uid")
            current = self.get(request.resource, request.namespace, request.name)
            if wanted and current is not None and current["metadata"].get("uid") != wanted:
                return _status(409, "Conflict", f"Precondition failed: UID in precondition: "
                               f"{wanted}, UID in object meta: {current['metadata'].get('uid')}")
            return None
        if request.action not in (action.CREATE, action.UPDATE) or not isinstance(
                request.data, dict):
            return None
        meta = request.data.setdefault("metadata", {})
        if request.action == action.UPDATE:
            current = self.get(request.resource, request.namespace, request.name)
            if current is None:
                return None  # the emulator answers 404
            wanted = meta.get("resourceVersion")
            if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
                return _status(409, "Conflict", f"the object has been modified; "
                               f"resourceVersion {wanted} is not the current one")
            stored = merge_patch(current, request.data)
        else:
            stored = request.data
            meta.setdefault("namespace", request.namespace)
        if request.resource == PYTORCHJOBS:
            try:
                self._validate(stored)
            except PyTorchJobValidationError as err:
                return _status(422, "Invalid", str(err))
        self._stamp(meta, creating=request.action == action.CREATE)
        return None

    def _scale(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        job = self.get(PYTORCHJOBS, request.namespace, request.name)
        if job is None:
            return _status(404, "NotFound", f"pytorchjobs {request.name} not found")
        if request.method.value.upper() in ("PATCH", "PUT"):
            replicas = ((request.data or {}).get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                return _status(422, "Invalid", "spec.replicas must be a non-negative integer")
            patched = merge_patch(job, {"spec": {"pytorchReplicaSpecs": {
                "Worker": {"replicas": replicas}}}})
            try:
                self._validate(patched)
            except PyTorchJobValidationError as err:
                return _status(422, "Invalid", str(err))
            self.put(PYTORCHJOBS, request.namespace, request.name, patched)
            job = self.get(PYTORCHJOBS, request.namespace, request.name)
        worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
        active = (((job.get("status") or {}).get("replicaStatuses") or {})
                  .get("Worker") or {}).get("active", 0)
        return aiohttp.web.json_response({
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": request.name, "namespace": request.namespace,
                         "resourceVersion": job["metadata"].get("resourceVersion")},
            "spec": {"replicas": worker.get("replicas", 1)},
            "status": {"replicas": active}})

    def _stamp(self, meta: dict, creating: bool) -> None:
        self._version += 1
        meta["resourceVersion"] = str(self._version)
        if creating:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", datetime.fromtimestamp(
                self.clock_s(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def _trim(self, request: kmock.Request) -> None:
        name = request.name or ((request.data or {}).get("metadata") or {}).get("name")
        namespace = request.namespace or ((request.data or {}).get("metadata") or {}).get(
            "namespace")
        key = (request.resource, namespace, name)
        if key in self.objects:
            del self.objects[key].history[:-_HISTORY_KEPT]


@functools.cache
def installed_crd() -> dict:
    """The PyTorchJob CRD the twin has installed (`INSTALLED_CRD_FILE`), parsed once: every
    `TwinKubeAPI` stores a copy; do not change it."""
    return crd_from_file(INSTALLED_CRD_FILE)


def _wants_table(request: kmock.Request) -> bool:
    """Whether the request asks for a Table of a kind `tables.COLUMNS` knows (kubectl get);
    others fall back to the plain object, which kubectl prints as NAME and AGE."""
    accept = next((value for key, value in request.headers.items() if key.lower() == "accept"),
                  "")
    return wants_table(accept) and request.resource in _SERVED


def _api_version(resource: kmock.resource) -> str:
    """`apiVersion` of `resource`'s objects: "v1" for the core group, "group/version" else."""
    return f"{resource.group}/{resource.version}" if resource.group else resource.version


def _status(code: int, reason: str, message: str,
            headers: dict[str, str] | None = None) -> aiohttp.web.StreamResponse:
    """A Kubernetes `Status` error response."""
    return aiohttp.web.json_response(
        {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
         "code": code, "reason": reason, "message": message}, status=code, headers=headers)


class ApiServerThread:
    """Runs a `TwinKubeAPI` on a real HTTP port in a background thread with its own event loop.

    `call` runs a function in that thread (so it never races the HTTP handlers) and returns
    its result; `every` schedules one periodically there.
    """

    def __init__(self, api: TwinKubeAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = api
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped: asyncio.Future | None = None
        self._thread = threading.Thread(target=self._run, name="twin-kube-api", daemon=True)
        self.url = ""
        self._error: BaseException | None = None

    def start(self) -> ApiServerThread:
        """Start serving; returns once the port is open."""
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._stopped is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set_result, None)
            self._thread.join(10)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` in the server's thread and return its result."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # handed back to the caller
                future.set_exception(err)

        self._loop.call_soon_threadsafe(run)
        return future.result(60)

    def every(self, interval_s: float, fn: Callable[[], None]) -> None:
        """Call `fn` in the server's thread every `interval_s` seconds until `stop`."""

        async def repeat() -> None:
            while True:
                try:
                    fn()
                except Exception:  # a bug in one tick must not freeze the twin silently
                    log.exception("twin: periodic step failed")
                await asyncio.sleep(interval_s)

        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(repeat()))

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as err:  # reported by start()
            self._error = err
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopped = self._loop.create_future()
        async with self.api, Server(self.api, host=self._host, port=self._port or None) as server:
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stopped
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()


def dump_kubeconfig(url: str) -> str:
    """A kubeconfig (YAML is a superset of JSON) pointing at an unauthenticated API at `url`."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "rlalloc-twin",
        "clusters": [{"name": "rlalloc-twin", "cluster": {"server": url}}],
        "users": [{"name": "rlalloc-twin", "user": {}}],
        "contexts": [{"name": "rlalloc-twin",
                      "context": {"cluster": "rlalloc-twin", "user": "rlalloc-twin"}}],
    }, indent=2)
