"""Validate PyTorchJob objects against the Kubeflow Training Operator's own CRD schema.

The API server would reject (or silently prune) fields the CRD does not know; checking every
object rlalloc writes — the shipped manifests here, the actuator's patches — against the same
`openAPIV3Schema` catches that in tests instead of in a cluster. The CRD file is found from, in
order: the `crd_path` argument, the RLALLOC_CRD_PATH environment variable, and the project's
default `<repo>/../shared/data/k8s/kubeflow.org_pytorchjobs.v1.9.0.yaml`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import jsonschema
import yaml

from rlalloc.env.errors import UserError

CRD_PATH_ENV = "RLALLOC_CRD_PATH"
DEFAULT_CRD_PATH = (Path(__file__).resolve().parents[1].parent / "shared" / "data" / "k8s"
                    / "kubeflow.org_pytorchjobs.v1.9.0.yaml")
API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"


class PyTorchJobValidationError(ValueError):
    """An object that the PyTorchJob CRD would reject; the message names the field and the rule."""


def resolve_crd_path(crd_path: Path | str | None = None) -> Path:
    """The CRD file to use: argument, then $RLALLOC_CRD_PATH, then the project default."""
    return Path(crd_path or os.environ.get(CRD_PATH_ENV) or DEFAULT_CRD_PATH)


def check_crd(crd_path: Path | str | None = None) -> Path:
    """Load the CRD now and return its path (resolved as in `resolve_crd_path`), or raise a
    one-line `UserError` naming it: a service that writes PyTorchJobs calls this at start-up,
    so a missing or wrong CRD file stops it there, not at its first write."""
    path = resolve_crd_path(crd_path)
    _validator(path)
    return path


@functools.lru_cache(maxsize=4)
def _validator(crd_path: Path) -> jsonschema.protocols.Validator:
    """Parse the CRD once per path and build a validator for its `v1` openAPIV3Schema."""
    fix = f"set {CRD_PATH_ENV} to kubeflow.org_pytorchjobs.v1.9.0.yaml"
    try:
        crd = yaml.safe_load(crd_path.read_text())
    except OSError as err:
        raise UserError(f"cannot read the PyTorchJob CRD at {crd_path} ({err.strerror}); "
                        f"{fix}") from err
    except yaml.YAMLError as err:
        raise UserError(f"the PyTorchJob CRD at {crd_path} is not valid YAML; {fix}") from err
    try:
        versions = {v["name"]: v for v in crd["spec"]["versions"]}
    except (KeyError, TypeError) as err:
        raise UserError(f"{crd_path} is not a CustomResourceDefinition (no spec.versions); "
                        f"{fix}") from err
    if "v1" not in versions:
        raise UserError(f"{crd_path} has no v1 version; is it the PyTorchJob CRD? {fix}")
    schema = versions["v1"]["schema"]["openAPIV3Schema"]
    validator_class = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft7Validator)
    return validator_class(schema)


def validate_pytorchjob(obj: dict, crd_path: Path | str | None = None) -> None:
    """Raise `PyTorchJobValidationError` unless `obj` is a PyTorchJob the CRD accepts.

    All schema violations are reported in one message, each as `field.path: problem`, so a
    caller can log a single line.
    """
    name = obj.get("metadata", {}).get("name", "<unnamed>") if isinstance(obj, dict) else "?"
    if not isinstance(obj, dict):
        raise PyTorchJobValidationError(f"PyTorchJob must be a mapping, got {type(obj).__name__}")
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        raise PyTorchJobValidationError(
            f"PyTorchJob {name}: apiVersion/kind are {obj.get('apiVersion')!r}/"
            f"{obj.get('kind')!r}, expected {API_VERSION!r}/{KIND!r}")
    errors = sorted(_validator(resolve_crd_path(crd_path)).iter_errors(obj),
                    key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        problems = "; ".join(
            f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors)
        raise PyTorchJobValidationError(f"PyTorchJob {name} violates the CRD schema: {problems}")
