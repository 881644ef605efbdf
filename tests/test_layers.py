"""Layering: the state contract and featurizer stay light; the actuator never needs the
simulator's internals or the training stack (kopf-style import contracts, checked in a fresh
interpreter so nothing else already imported hides a violation)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "stable_baselines3", "sb3_contrib", "kubernetes", "pandas", "scipy")


def imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("module", ["rlalloc.env.state", "rlalloc.env.featurizer", "rlalloc.env.placement",
                                    "rlalloc.env.telemetry_names", "rlalloc.env.failures"])
def test_contract_modules_import_nothing_heavy(module):
    loaded = imported_after(f"import {module}")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_simulator_core_does_not_need_torch_or_the_rl_library():
    loaded = imported_after("import env.simulator, env.gym_env")
    assert not loaded & {"torch", "stable_baselines3", "sb3_contrib", "kubernetes"}


def test_default_signals_load_without_torch():
    loaded = imported_after("from env.signals import load_signals; load_signals('standin')")
    assert "torch" not in loaded and "statsmodels" not in loaded


def test_a_heuristic_loads_without_torch_and_a_learned_policy_with_it():
    """Commands that run only heuristics (simulate, evaluate of baselines, bench sim) do not pay
    for torch; the shipped models, which need it, still load."""
    heuristics = imported_after("from agent.registry import load_policy; "
                                "[load_policy(n) for n in ('static', 'tiresias', 'proactive')]")
    assert "torch" not in heuristics
    assert "torch" in imported_after("from agent.registry import load_policy; load_policy('ppo')")


def test_an_evaluate_run_of_a_heuristic_does_not_load_torch():
    """Each evaluate worker would pay ~1 s and ~180 MB for a torch it never uses."""
    loaded = imported_after("from rlalloc.cli.evaluate import RunSpec, _run_one; "
                            "_run_one(RunSpec('elastic', 'synthetic:8:1.0', 0, '2x4', 0.0))")
    assert "torch" not in loaded
