"""Job speed: the Pollux profile model on the real measurements and the fitted generic model."""

from __future__ import annotations

import statistics
import time
from importlib.resources import files
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlalloc.env.errors import UserError
from rlalloc.env.gpu_types import PROFILE_SUFFIX
from rlalloc.env.profiles import (
    DEFAULT_PROFILES_ROOT,
    GENERIC_ALPHA,
    GENERIC_BETA,
    GENERIC_RESTORE_S,
    GENERIC_SCALING,
    RESTORE_S,
    GenericScaling,
    canonical_shape,
    fit_batch_size,
    fit_generic_scaling,
    load_profiles,
    packed_shape,
)

from shared_data import POLLUX_DATA, SIA_DATA


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(DEFAULT_PROFILES_ROOT)


def test_generic_model_without_data():
    model = GenericScaling(0.2, 0.1)
    assert model.iterations_per_s((1,)) == 1.0
    assert model.iterations_per_s((4,)) == pytest.approx(4 / (1 + 0.2 * 3))
    assert model.iterations_per_s((2, 2)) == pytest.approx(4 / (1 + 0.2 * 3 + 0.1 * 4))
    assert model.iterations_per_s(()) == 0.0
    assert GENERIC_SCALING.iterations_per_s((4,)) > GENERIC_SCALING.iterations_per_s((2, 2))


def test_shapes():
    assert canonical_shape([0, 2, 4, 0, 1]) == (4, 2, 1)
    assert packed_shape(10, 4) == (4, 4, 2)
    assert packed_shape(8, 8) == (8,)


def test_restore_defaults():
    assert GENERIC_RESTORE_S == statistics.median(RESTORE_S.values())


def test_missing_profiles_root(tmp_path):
    with pytest.raises(UserError, match="RLALLOC_PROFILES"):
        load_profiles(tmp_path / "absent")


def test_generic_constants_match_refit(profiles):
    fit = fit_generic_scaling(profiles)
    assert fit.alpha == pytest.approx(GENERIC_ALPHA, abs=1e-4)
    assert fit.beta == pytest.approx(GENERIC_BETA, abs=1e-4)
    assert fit.alpha > 0 and fit.beta > 0


def test_packed_faster_than_spread_as_measured(profiles):
    cifar10 = profiles["cifar10"]
    model = cifar10.throughput(fit_batch_size(cifar10))
    assert model.iterations_per_s((4,)) > model.iterations_per_s((2, 2))
    assert model.iterations_per_s((4,)) > model.iterations_per_s((1, 1, 1, 1))
    for profile in profiles.values():
        scaling = profile.scaling_fit(fit_batch_size(profile))
        assert scaling.alpha >= 0 and scaling.beta >= 0


def test_measured_placement_is_read_back(profiles):
    rows = pd.read_csv(DEFAULT_PROFILES_ROOT / "cifar10" / "placements.csv")
    row = rows[(rows.placement == 4) & (rows.local_bsz == 32)].iloc[0]
    speed = profiles["cifar10"].throughput(128).iterations_per_s((4,))
    assert speed == pytest.approx(1 / row.step_time)


def test_gradient_accumulation(profiles):
    rows = pd.read_csv(DEFAULT_PROFILES_ROOT / "yolov3" / "placements.csv")
    row = rows[(rows.placement == 1) & (rows.local_bsz == 8)].iloc[0]
    # B=64 on one GPU: local 64 > max_local 8, so 7 extra micro-steps of 8 samples.
    expected_step_s = row.step_time + 7 * (row.step_time - row.sync_time)
    speed = profiles["yolov3"].throughput(64).iterations_per_s((1,))
    assert speed == pytest.approx(1 / expected_step_s)


def test_unmeasured_placements_interpolate(profiles):
    model = profiles["imagenet"].throughput(6400)
    for shape in [(4,) * 8, (8, 8), (8,) * 16, (2, 1, 1, 1, 1, 1)]:
        speed = model.iterations_per_s(shape)
        assert np.isfinite(speed) and speed > 0
    assert model.iterations_per_s((8,) * 8) > model.iterations_per_s((4,))


def test_larger_placements_read_scalability_csv_and_clamp_to_its_widest(profiles):
    """A placement not in placements.csv at a grid point of scalability.csv (nodes, replicas,
    local batch) is that row's step time; one over more nodes than were measured reads as the
    widest measured (16 nodes), interpolated linearly between the replica counts around it."""
    rows = pd.read_csv(DEFAULT_PROFILES_ROOT / "imagenet" / "scalability.csv")

    def measured_step_s(nodes: int, replicas: int) -> float:
        row = rows[(rows.num_nodes == nodes) & (rows.num_replicas == replicas)
                   & (rows.local_bsz == 40)]
        return float(row.step_time.iloc[0])

    imagenet = profiles["imagenet"]
    assert imagenet.max_local_bsz >= 40  # no gradient accumulation at local batch 40
    # 6 nodes of 1 GPU at global batch 240: local batch 40
    speed = imagenet.throughput(6 * 40).iterations_per_s((1,) * 6)
    assert speed == pytest.approx(1 / measured_step_s(6, 6), rel=1e-9)
    # 30 nodes of 1 GPU: as 16 nodes with 30 replicas, halfway between the 28 and 32 measured
    # (the nearest measurement to 30 nodes would be the 32 alone)
    speed = imagenet.throughput(30 * 40).iterations_per_s((1,) * 30)
    halfway_s = (measured_step_s(16, 28) + measured_step_s(16, 32)) / 2
    assert speed == pytest.approx(1 / halfway_s, rel=1e-6)


def test_memoised_call_is_cheap(profiles):
    model = profiles["bert"].throughput(384)
    model.iterations_per_s((4, 2))
    assert model.iterations_per_s((2, 4)) == model.iterations_per_s((4, 2))
    calls = 100_000
    start = time.perf_counter()
    for _ in range(calls):
        model.iterations_per_s((4, 2))
    assert (time.perf_counter() - start) / calls < 2e-6


def test_work_and_bounds(profiles):
    cifar10 = profiles["cifar10"]
    validation = pd.read_csv(DEFAULT_PROFILES_ROOT / "cifar10" / "validation-2048.csv")
    assert cifar10.work_iterations(2048) == validation.iteration[99]
    between = cifar10.work_iterations(3072)
    assert min(cifar10.work_iterations(2048), cifar10.work_iterations(4096)) <= between
    assert between <= max(cifar10.work_iterations(2048), cifar10.work_iterations(4096))
    with pytest.raises(ValueError, match="validated range"):
        cifar10.work_iterations(64)
    assert cifar10.max_workers(2048) == 2048 // 32
    assert profiles["yolov3"].max_local_bsz == 8


def test_the_default_profiles_are_the_shipped_copy_of_the_published_ones():
    """The program reads the profiles it ships (with their licence and sources), never
    ../shared; the shipped files are the published ones, byte for byte: Pollux's T4 files and
    Sia's per-type files (`PROFILE_SUFFIX`), with Sia's seventh application, gpt_pmp."""
    assert DEFAULT_PROFILES_ROOT == Path(str(files("rlalloc.env") / "app_profiles"))
    assert (DEFAULT_PROFILES_ROOT / "LICENSE").is_file()
    shipped = sorted(p.relative_to(DEFAULT_PROFILES_ROOT)
                     for p in DEFAULT_PROFILES_ROOT.rglob("*.csv"))
    assert {p.parts[0] for p in shipped} == {*RESTORE_S, "gpt_pmp"}
    for source in (POLLUX_DATA / "app_profiles", SIA_DATA / "app_profiles"):
        if not source.is_dir():
            continue
        for relative in shipped:
            if (source / relative).is_file():
                assert (DEFAULT_PROFILES_ROOT / relative).read_bytes() == \
                    (source / relative).read_bytes(), relative
    if (SIA_DATA / "app_profiles").is_dir():
        suffixes = {suffix for suffix in PROFILE_SUFFIX.values() if suffix}
        wanted = sorted(p.relative_to(SIA_DATA / "app_profiles")
                        for p in (SIA_DATA / "app_profiles").rglob("*.csv")
                        if p.stem.startswith("validation")
                        or p.stem.split("-", 1)[-1] in {s[1:] for s in suffixes}
                        or (p.stem in ("placements", "scalability")))
        assert shipped == wanted
