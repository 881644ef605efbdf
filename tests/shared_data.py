"""Where the tests find the data beside the project (`../shared/data`), which the program itself
never needs; tests that read it skip, saying so, where it is absent (a clone on its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
POLLUX_DATA = SHARED_DATA / "traces" / "pollux"
POLLUX_WORKLOADS = POLLUX_DATA / "workloads"
PHILLY_CSV = POLLUX_DATA / "philly.csv"
SIA_DATA = SHARED_DATA / "traces" / "sia"
HELIOS_DATA = SHARED_DATA / "traces" / "helios"
CRD_FILE = SHARED_DATA / "k8s" / "kubeflow.org_pytorchjobs.v1.9.0.yaml"

needs_pollux = pytest.mark.skipif(not POLLUX_WORKLOADS.is_dir(),
                                  reason="the shared Pollux workloads are absent")
needs_philly = pytest.mark.skipif(not PHILLY_CSV.is_file(),
                                  reason="the shared Philly trace is absent")
