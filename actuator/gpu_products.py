"""A node's GPU product, as NVIDIA GPU Feature Discovery labels it, to the simulator's GPU type.

GPU Feature Discovery (GFD, part of the GPU Operator) labels every GPU node
``nvidia.com/gpu.product`` with the NVML name of its GPUs, spaces replaced by ``-``: ``Tesla T4``
is ``Tesla-T4``, ``NVIDIA A100-SXM4-40GB`` is ``NVIDIA-A100-SXM4-40GB``. Two suffixes follow:
``-SHARED`` when the GPUs are time-sliced (replicas > 1, not renamed), and, with the MIG
strategy ``single``, ``-MIG-<profile>`` (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``). Older drivers
name the same GPU without the ``NVIDIA`` prefix (``A100-SXM4-40GB``, ``GeForce RTX 2080 Ti``).

A `GpuProduct` maps the values its regular expression matches, whole and in any case, to a
simulator type; a trailing ``-SHARED`` is removed first, as a time-sliced GPU is the same model.
`DEFAULT_GPU_PRODUCTS` covers the real names of the six types the simulator knows and,
so that a hand-set label still works, the type names themselves. No default matches a MIG slice
(a seventh of an A100 is no A100) nor a look-alike of another generation (``NVIDIA-RTX-A6000``,
``NVIDIA RTX 6000 Ada Generation``, ``NVIDIA-A10``, ``NVIDIA-H200``): such a node's type is
unknown until the config maps it. `TWIN_PRODUCTS` goes the other way, one real product a type,
for the digital twin's nodes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rlalloc.env.cluster import gpu_type_named
from rlalloc.env.errors import UserError

SHARED_SUFFIX = "-SHARED"
"""What GFD appends to the product of time-sliced GPUs (unless the resource is renamed)."""


@dataclass(frozen=True)
class GpuProduct:
    """One row of the product table: label values `pattern` matches are GPUs of `gpu_type`."""

    pattern: str
    """Regular expression (Python `re`) matched against the whole label value, any case."""
    gpu_type: str
    """A type the simulator knows (`rlalloc.env.cluster.gpu_type_named`)."""


DEFAULT_GPU_PRODUCTS: tuple[GpuProduct, ...] = (
    # Tesla-T4
    GpuProduct(r"(Tesla-|NVIDIA-)?T4", "T4"),
    # Tesla-V100-SXM2-16GB, Tesla-V100-SXM2-32GB, Tesla-V100-PCIE-16GB, Tesla-V100S-PCIE-32GB,
    # Tesla-V100-SXM3-32GB (DGX-2), Tesla-V100-FHHL-16GB, Tesla-V100-DGXS-32GB
    GpuProduct(r"(Tesla-|NVIDIA-)?V100S?(-(SXM2|SXM3|PCIE|FHHL|DGXS))?(-(16|32)GB)?(-LS)?",
               "V100"),
    # NVIDIA-A100-SXM4-40GB, NVIDIA-A100-SXM4-80GB, NVIDIA-A100-PCIE-40GB, NVIDIA-A100-80GB-PCIe,
    # A100-SXM4-40GB (older drivers)
    GpuProduct(r"(NVIDIA-)?A100(-(SXM4|SXM|PCIE))?(-(40|80)GB)?(-PCIE)?", "A100"),
    # NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe, NVIDIA-H100-NVL, NVIDIA-H100-SXM5-80GB
    GpuProduct(r"(NVIDIA-)?H100(-(SXM5|PCIE))?(-(80|94|96)GB)?(-(HBM3|HBM3e|PCIE|NVL))?",
               "H100"),
    # NVIDIA-GeForce-RTX-2080-Ti, NVIDIA-GeForce-RTX-2080-Ti-Rev.-A, GeForce-RTX-2080-Ti (older
    # drivers)
    GpuProduct(r"(NVIDIA-)?(GeForce-)?RTX-2080-Ti(-Rev\.-A)?|RTX2080Ti", "RTX2080Ti"),
    # Quadro-RTX-6000 (Turing; not the Ampere RTX A6000 nor the Ada RTX 6000)
    GpuProduct(r"(NVIDIA-)?Quadro-RTX-6000|RTX6000", "RTX6000"),
)
"""The shipped product table, tried after the config's own rows (`ActuatorConfig.gpu_products`);
the comments list the GFD values each row is meant for."""

TWIN_PRODUCTS: dict[str, str] = {
    "T4": "Tesla-T4",
    "V100": "Tesla-V100-SXM2-32GB",
    "A100": "NVIDIA-A100-SXM4-40GB",
    "H100": "NVIDIA-H100-80GB-HBM3",
    "RTX2080Ti": "NVIDIA-GeForce-RTX-2080-Ti",
    "RTX6000": "Quadro-RTX-6000",
}
"""The product label the digital twin gives a node of each simulator type: a value GFD writes
for a GPU of that type, which `DEFAULT_GPU_PRODUCTS` maps back to the type."""


def gpu_type_of(product: str, table: Sequence[GpuProduct]) -> str | None:
    """The GPU type of the first row of `table` whose pattern matches `product` (a node's
    product label) whole, in any case, once a trailing ``-SHARED`` is removed; None when no row
    does."""
    model = product.removesuffix(SHARED_SUFFIX)
    for row in table:
        if re.fullmatch(row.pattern, model, re.IGNORECASE):
            return row.gpu_type
    return None


def checked_table(table: Sequence[GpuProduct], where: str) -> tuple[GpuProduct, ...]:
    """`table` with each type spelled as the simulator spells it (``a100`` is ``A100``); a
    `UserError` naming the row (``where[i]``) for a pattern that is no regular expression or a
    type the simulator does not know."""
    checked = []
    for i, row in enumerate(table):
        try:
            re.compile(row.pattern)
        except (re.error, TypeError) as err:
            raise UserError(f"{where}[{i}]: pattern {row.pattern!r} is not a regular "
                            f"expression ({err})") from err
        checked.append(GpuProduct(row.pattern, gpu_type_named(row.gpu_type, f"{where}[{i}]")))
    return tuple(checked)
