"""Validate PyTorchJob objects against the Kubeflow Training Operator's own CRD schema.

The API server checks a PyTorchJob against the `openAPIV3Schema` of the CRD installed in the
cluster, and drops the fields that schema does not know (or, asked for
`fieldValidation=Strict`, as the actuator's writes do, refuses them). A `PyTorchJobValidator`
checks an object the same way — types, enums and required fields, and unknown fields — so a
wrong patch fails before it is sent, and the shipped manifests fail in tests, not in a cluster.

It is built from the CRD itself, wherever that came from: read from the cluster
(`KubeClient.read_pytorchjob_crd`, what `rlalloc actuate` does unless told otherwise), served by
the digital twin, or read from a file (`crd_from_file`, `file_validator`: the one RLALLOC_CRD_PATH
names, when it is set, for `rlalloc actuate`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import yaml

from rlalloc.actuator.k8s_names import PYTORCHJOB_GROUP, PYTORCHJOB_KIND, PYTORCHJOB_VERSION
from rlalloc.env.errors import UserError

CRD_PATH_ENV = "RLALLOC_CRD_PATH"
"""The environment variable naming a PyTorchJob CRD file to use instead of the cluster's."""
_API_VERSION = f"{PYTORCHJOB_GROUP}/{PYTORCHJOB_VERSION}"
_FILE_FIX = f"set {CRD_PATH_ENV} to a copy of kubeflow.org_pytorchjobs.v1.9.0.yaml"


class PyTorchJobValidationError(ValueError):
    """An object that the PyTorchJob CRD would reject; the message names the field and the rule."""


class PyTorchJobValidator:
    """Checks PyTorchJobs against one CRD's v1 schema (call it with the object)."""

    def __init__(self, crd: object, source: str) -> None:
        """`crd`: the CustomResourceDefinition as a dict; `source`: where it came from, as the
        messages name it ("the cluster's CRD ...", a file path). A CRD without a v1 schema is
        a one-line `UserError` naming `source`."""
        self.source = source
        self._schema = _v1_schema(crd, source)
        validator_class = jsonschema.validators.validator_for(
            self._schema, default=jsonschema.Draft7Validator)
        self._validator = validator_class(self._schema)

    def __call__(self, obj: dict) -> None:
        """Raise `PyTorchJobValidationError` unless `obj` is a PyTorchJob the CRD accepts.

        All violations are reported in one message, each as `field.path: problem`, so a caller
        can log a single line."""
        if not isinstance(obj, dict):
            raise PyTorchJobValidationError(
                f"PyTorchJob must be a mapping, got {type(obj).__name__}")
        name = (obj.get("metadata") or {}).get("name", "<unnamed>")
        if obj.get("apiVersion") != _API_VERSION or obj.get("kind") != PYTORCHJOB_KIND:
            raise PyTorchJobValidationError(
                f"PyTorchJob {name}: apiVersion/kind are {obj.get('apiVersion')!r}/"
                f"{obj.get('kind')!r}, expected {_API_VERSION!r}/{PYTORCHJOB_KIND!r}")
        problems = [(list(map(str, e.absolute_path)), e.message)
                    for e in self._validator.iter_errors(obj)]
        problems += [(path, "unknown field") for path in _unknown_fields(obj, self._schema)]
        if problems:
            shown = "; ".join(f"{'.'.join(path) or '<root>'}: {problem}"
                              for path, problem in sorted(problems))
            raise PyTorchJobValidationError(
                f"PyTorchJob {name} violates the CRD schema ({self.source}): {shown}")


def _unknown_fields(obj: object, schema: dict, path: tuple[str, ...] = ()) -> Iterator[list[str]]:
    """Paths of the fields of `obj` that the structural `schema` does not declare: those the API
    server prunes, or refuses under `fieldValidation=Strict`. The root's `metadata` is the API
    server's ObjectMeta, not the CRD's to declare, so it is not looked into."""
    if isinstance(obj, list):
        for index, item in enumerate(obj):
            yield from _unknown_fields(item, schema.get("items") or {}, (*path, str(index)))
        return
    if not isinstance(obj, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    declared = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    for key, value in obj.items():
        if not path and key == "metadata":
            continue
        if key in declared:
            yield from _unknown_fields(value, declared[key], (*path, key))
        elif isinstance(additional, dict):
            yield from _unknown_fields(value, additional, (*path, key))
        elif additional is not True:
            yield [*path, key]


def _v1_schema(crd: object, source: str, fix: str = "") -> dict:
    """The `openAPIV3Schema` of `crd`'s v1 version, or a one-line `UserError` naming `source`
    (and, if given, `fix`)."""
    then = f"; {fix}" if fix else ""
    try:
        versions = {v["name"]: v for v in crd["spec"]["versions"]}
    except (KeyError, TypeError) as err:
        raise UserError(f"{source} is not a CustomResourceDefinition (no spec.versions)"
                        f"{then}") from err
    if "v1" not in versions:
        raise UserError(f"{source} has no v1 version; is it the PyTorchJob CRD?{then}")
    try:
        return versions["v1"]["schema"]["openAPIV3Schema"]
    except (KeyError, TypeError) as err:
        raise UserError(f"{source} has no v1 openAPIV3Schema; is it the PyTorchJob CRD?"
                        f"{then}") from err


def crd_from_file(path: Path | str) -> dict:
    """The PyTorchJob CRD in the YAML file at `path`, or a one-line `UserError` naming the file
    and the fix (it cannot be read, is not YAML, is not a CRD, has no v1 schema)."""
    path = Path(path)
    try:
        crd = yaml.safe_load(path.read_text())
    except OSError as err:
        raise UserError(f"cannot read the PyTorchJob CRD at {path} ({err.strerror}); "
                        f"{_FILE_FIX}") from err
    except yaml.YAMLError as err:
        raise UserError(f"the PyTorchJob CRD at {path} is not valid YAML; {_FILE_FIX}") from err
    _v1_schema(crd, str(path), _FILE_FIX)
    return crd


@functools.lru_cache(maxsize=4)
def file_validator(path: Path) -> PyTorchJobValidator:
    """A validator of the CRD file at `path` (parsed once per path: the file is large), or a
    one-line `UserError` as `crd_from_file` says."""
    return PyTorchJobValidator(crd_from_file(path), str(path))
