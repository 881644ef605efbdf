"""Layering at run time, where the static contracts of `.importlinter` (checked by `lint-imports`
in `make test`) cannot see: what a fresh interpreter loads, lazy imports included."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "stable_baselines3", "sb3_contrib", "kubernetes", "pandas", "scipy")


def imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_state_contract_loads_without_gymnasium_or_anything_heavy():
    """What import-linter cannot see: the package `__init__`s run on the way in (the
    Gymnasium environment registers only when `rlalloc.env.gym_env` is imported)."""
    loaded = imported_after("import rlalloc.env.state, rlalloc.env.featurizer")
    assert not loaded & {*HEAVY, "gymnasium"}, loaded & {*HEAVY, "gymnasium"}


def test_default_signals_load_without_torch():
    loaded = imported_after("from rlalloc.forecaster.signals import load_signals; "
                            "load_signals('standin')")
    assert "torch" not in loaded and "statsmodels" not in loaded


def test_a_heuristic_loads_without_torch_and_a_learned_policy_with_it():
    """Commands that run only heuristics (simulate, evaluate of baselines, bench sim) do not pay
    for torch; the shipped models, which need it, still load."""
    heuristics = imported_after("from rlalloc.agent.registry import load_policy; "
                                "[load_policy(n) for n in ('static', 'tiresias', 'proactive')]")
    assert "torch" not in heuristics
    assert "torch" in imported_after("from rlalloc.agent.registry import load_policy; "
                                     "load_policy('ppo')")


def test_an_evaluate_run_of_a_heuristic_does_not_load_torch():
    """Each evaluate worker would pay ~1 s and ~180 MB for a torch it never uses."""
    loaded = imported_after("from rlalloc.agent.comparison_runs import RunSpec, run_one; "
                            "run_one(RunSpec('elastic', 'synthetic:8:1.0', 0, '2x4', 0.0))")
    assert "torch" not in loaded
