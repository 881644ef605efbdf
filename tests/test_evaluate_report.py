"""`rlalloc evaluate`'s report: it says when seeds repeated one run, keeps equal curves
visible in its plots (of different lengths too), draws a negligible paired change small, says
how often a planner left its base, and is replaced whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure
import numpy as np
import pytest
import scipy.stats

from rlalloc.agent import comparison_runs, registry
from rlalloc.agent.comparison_plots import (
    PAIRED_MIN_SPAN_PCT,
    PAIRED_PLOT,
    _dash_style,
    same_curves,
    write_plots,
)
from rlalloc.agent.comparison_report import results_markdown, workload_table
from rlalloc.agent.comparison_runs import RunSpec
from rlalloc.agent.comparison_stats import (
    confidence,
    paired_changes,
    repeated_runs,
    summarise,
)
from rlalloc.agent.evaluation import lookahead_counts, run_policy
from rlalloc.agent.lookahead import HistoryArrivals, LookaheadPolicy
from rlalloc.agent.planner import planning_policy
from rlalloc.cli.main import main
from rlalloc.env.failures import FailureParams
from rlalloc.env.metrics import METRIC_KEYS
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import build_scenario
from rlalloc.env.state import Action, ActionKind, ClusterState, JobStatus

EVALUATE = ["evaluate", "--cluster", "2x4", "--seeds", "2", "--jobs", "1", "--failures", "none",
            "--policies", "static,elastic"]
JOBS_CSV = ("job_id,submit_s,num_gpus,duration_s\n"
            "a,0,4,3600\nb,60,4,1800\nc,120,2,900\nd,300,8,600\n")
"""A workload file: nothing in it is drawn from the seed."""


def files(directory: Path) -> dict[str, bytes]:
    """Every file under `directory`, hidden ones included (relative path -> bytes)."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _runs(avg_jct_s: dict[tuple[str, int], float], workloads=("w",)) -> dict[RunSpec, dict]:
    """Runs of each (policy, seed) with every metric at this avg JCT, on every workload (but
    mean_recovery_s, NaN as in a run without failures)."""
    return {RunSpec(policy, workload, seed, "2x4", 0.0): {
                "metrics": {**dict.fromkeys(METRIC_KEYS, jct), "mean_recovery_s": float("nan")},
                "finished": True, "lookahead": None}
            for (policy, seed), jct in avg_jct_s.items() for workload in workloads}


def _report(results: dict[RunSpec, dict], names: dict[str, str]) -> dict:
    seeds = sorted({spec.seed for spec in results})
    workloads = sorted({spec.workload for spec in results})
    return summarise(results, names, workloads, seeds, "2x4", "none")


@pytest.mark.parametrize("jcts, repeated", [
    ({("a", 0): 10.0, ("a", 1): 10.0, ("b", 0): 8.0, ("b", 1): 8.0}, ["a", "b"]),
    ({("a", 0): 10.0, ("a", 1): 10.0, ("b", 0): 8.0, ("b", 1): 9.0}, ["a"]),
    ({("a", 0): 10.0, ("a", 1): 11.0, ("b", 0): 8.0, ("b", 1): 9.0}, []),
    ({("a", 0): 10.0, ("b", 0): 8.0}, []),  # one seed: nothing to repeat
])
def test_seeds_that_repeat_one_run_are_found_from_the_runs(jcts, repeated):
    names = {"a": "a", "b": "b"}
    # NaN metrics equal their copies
    assert sorted(repeated_runs(_runs(jcts))) == [(policy, "w") for policy in repeated]
    report = _report(_runs(jcts), names)
    assert report["seeds_repeat"] == {policy: ["w"] for policy in repeated}
    note = results_markdown(report, with_paired=False)
    if repeated == ["a", "b"]:
        assert "all 2 seeds gave the same run for every policy on each workload" in note
        assert "one run and no ±" in note and "--failures" in note
        assert "| a | 10.0 ± n/a |" in note  # one run: no CI, not a CI of 0
    elif repeated:
        assert "all 2 seeds gave the same run for `a` on each workload" in note
    else:
        assert "gave the same run" not in note


def test_repeated_seeds_count_each_distinct_run_once():
    """3 seeds that repeat each of 2 workloads' runs are 2 runs, not 6: counted as 6, the CI
    was too narrow (t over 5 degrees of freedom, n = 6) and "6 of 6 better" counted copies."""
    seeds = (0, 1, 2)
    jct = {("a", "w1"): 10.0, ("a", "w2"): 20.0, ("b", "w1"): 8.0, ("b", "w2"): 19.0}
    results = {RunSpec(policy, workload, seed, "2x4", 0.0): {
                   "metrics": dict.fromkeys(METRIC_KEYS, value), "finished": True,
                   "lookahead": None}
               for (policy, workload), value in jct.items() for seed in seeds}
    names = {"a": "a", "b": "b"}
    report = _report(results, names)
    report["paired"] = paired_changes(results, names, "a")
    assert report["seeds_repeat"] == {"a": ["w1", "w2"], "b": ["w1", "w2"]}
    two_runs = confidence([10.0, 20.0])
    assert report["policies"]["a"]["avg_jct_s"] == pytest.approx(two_runs)
    paired = report["paired"]["policies"]["b"]["avg_jct_s"]
    assert (paired["runs"], paired["better_runs"]) == (2, 2)
    assert paired == pytest.approx({**confidence([-20.0, -5.0]), "unit": "%",
                                    "runs_with_change": 2, "better_runs": 2, "runs": 2})
    md = results_markdown(report, with_paired=True)
    assert "take each such run once, not as 3 independent copies" in md
    assert "Kish's effective number" in md
    assert ("(t-distribution over 6 runs = seeds × workloads; a run that every seed repeated "
            "is not counted as independent copies in the ±, below)") in md
    assert "(2/2 better)" in md


def test_a_run_repeated_beside_runs_that_vary_counts_once(tmp_path, monkeypatch):
    """A workload file without failures beside a synthetic workload: the file's 3 identical
    runs per policy are one, the synthetic's 3 runs are 3 (the whole policy was not marked as
    repeating, so the copies counted as independent: "6 of 6 better")."""
    drawn = _capture_figures(monkeypatch)
    jct = {("a", "file", 0): 10.0, ("a", "file", 1): 10.0, ("a", "file", 2): 10.0,
           ("b", "file", 0): 8.0, ("b", "file", 1): 8.0, ("b", "file", 2): 8.0,
           ("a", "synth", 0): 20.0, ("a", "synth", 1): 30.0, ("a", "synth", 2): 40.0,
           ("b", "synth", 0): 19.0, ("b", "synth", 1): 27.0, ("b", "synth", 2): 40.0}
    results = {RunSpec(policy, workload, seed, "2x4", 0.0): {
                   "metrics": dict.fromkeys(METRIC_KEYS, value), "finished": True,
                   "lookahead": None, "jcts_s": np.array([value]),
                   "series": {"t": [0.0], "alloc_gpus": [1], "queued_jobs": [0]}}
               for (policy, workload, seed), value in jct.items()}
    names = {"a": "a", "b": "b"}
    report = _report(results, names)
    report["paired"] = paired_changes(results, names, "a")
    assert report["seeds_repeat"] == {"a": ["file"], "b": ["file"]}
    # the mean weighs each of the 6 (workload, seed) runs alike: the file's run stands for 3
    # (over the 4 distinct runs it was 25, the file a quarter of the weight instead of half);
    # the CI counts 3 effective runs (Kish: 6^2 / (9 + 1 + 1 + 1)), not 6
    variance = (3 * 10.0 ** 2 + 0.0 + 10.0 ** 2 + 20.0 ** 2) / 6 * 3 / 2
    assert report["policies"]["a"]["avg_jct_s"] == pytest.approx(
        {"mean": 20.0, "ci95": scipy.stats.t.ppf(0.975, 2) * np.sqrt(variance / 3)})
    paired = report["paired"]["policies"]["b"]["avg_jct_s"]
    changes = [-20.0, -5.0, -10.0, 0.0]
    assert paired["mean"] == pytest.approx((3 * -20.0 - 5.0 - 10.0 + 0.0) / 6)
    assert paired == pytest.approx({**confidence(changes, [3, 1, 1, 1]),
                                    "unit": "%", "runs_with_change": 4, "better_runs": 3,
                                    "runs": 4})
    md = results_markdown(report, with_paired=True)
    assert "for `a` on file; `b` on file:" in md and "(3/4 better)" in md
    write_plots(results, names, tmp_path, reference="a")
    dots = drawn[PAIRED_PLOT].axes[0].collections[0].get_offsets()
    assert sorted(np.asarray(dots)[:, 0].tolist()) == sorted(changes)  # as results.json


def test_policies_whose_seeds_repeat_on_different_workloads_are_weighed_alike():
    """`a` repeats on w1 only, `b` on none: each mean is over the same 6 runs as asked, so `b`,
    better on every run, is better on average too (weighing distinct runs, `a`'s w1 counted a
    quarter and `b`'s a half, and `b` read as 25 % worse)."""
    jct = {("a", "w1"): [100.0] * 3, ("a", "w2"): [10.0, 11.0, 12.0],
           ("b", "w1"): [90.0, 91.0, 92.0], ("b", "w2"): [9.0, 10.0, 11.0]}
    results = {RunSpec(policy, workload, seed, "2x4", 0.0): {
                   "metrics": dict.fromkeys(METRIC_KEYS, value), "finished": True,
                   "lookahead": None}
               for (policy, workload), values in jct.items() for seed, value in enumerate(values)}
    report = _report(results, {"a": "a", "b": "b"})
    assert report["seeds_repeat"] == {"a": ["w1"]}
    means = {name: report["policies"][name]["avg_jct_s"]["mean"] for name in ("a", "b")}
    assert means == pytest.approx({name: np.mean(sum((jct[name, w] for w in ("w1", "w2")), []))
                                   for name in ("a", "b")})
    assert means["b"] < means["a"]


def test_a_run_that_stalls_is_not_counted_better(tmp_path):
    """A policy that starts no job finished none: over finished jobs only its JCT was 0 s,
    "-100 % ✓" and "2/2 better" than static. Its jobs count at their time in the system."""
    from rlalloc.env.state import NOOP

    scenario = build_scenario("synthetic:6:1:2", "2x4", seed=0)
    stalled = run_policy(scenario.simulator(seed=0), lambda state: NOOP)
    assert not stalled.finished
    metrics = stalled.metrics
    assert metrics["jobs_completed"] == 0
    assert metrics["avg_jct_s"] == pytest.approx(metrics["avg_queue_s"])  # none ever started
    assert metrics["avg_jct_s"] > 0.5 * metrics["makespan_s"]
    better = {"metrics": dict.fromkeys(METRIC_KEYS, 1.0), "finished": False, "lookahead": None}
    worse = {"metrics": dict.fromkeys(METRIC_KEYS, 2.0), "finished": True, "lookahead": None}
    results = {RunSpec(policy, "w", seed, "2x4", 0.0): run
               for seed in (0, 1) for policy, run in (("static", worse), ("stall", better))}
    names = {"static": "static", "stall": "stall"}
    report = _report(results, names)
    report["paired"] = paired_changes(results, names, "static")
    assert report["paired"]["policies"]["stall"]["avg_jct_s"]["better_runs"] == 0
    md = results_markdown(report, with_paired=True)
    assert "(-50%)" in md and "✓" not in md.split("\n\n")[2]  # the table: no ✓
    assert "a lower bound; no ✓ and no run counted better for them" in md


def test_evaluate_of_a_workload_file_without_failures_says_its_seeds_repeat(tmp_path, capsys):
    workload = tmp_path / "jobs.csv"
    workload.write_text(JOBS_CSV)
    assert main([*EVALUATE, "--workload", str(workload), "--out", str(tmp_path / "file")]) == 0
    report = json.loads((tmp_path / "file" / "results.json").read_text())
    assert report["seeds_repeat"] == {"static": [str(workload)], "elastic": [str(workload)]}
    assert "seeds gave the same run" in (tmp_path / "file" / "results.md").read_text()
    assert main([*EVALUATE, "--workload", "synthetic:8:1.0", "--out",
                 str(tmp_path / "synthetic")]) == 0  # a synthetic workload draws per seed
    report = json.loads((tmp_path / "synthetic" / "results.json").read_text())
    assert report["seeds_repeat"] == {}
    assert "same run" not in (tmp_path / "synthetic" / "results.md").read_text()
    capsys.readouterr()


def _capture_figures(monkeypatch) -> dict[str, matplotlib.figure.Figure]:
    """Figures by file name instead of PNGs."""
    drawn: dict[str, matplotlib.figure.Figure] = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, **kw: drawn.__setitem__(Path(path).name, fig))
    return drawn


def test_a_policy_with_the_same_curves_as_another_stays_visible(tmp_path, monkeypatch):
    """ppo equals elastic run for run: drawn solid, its line would hide elastic's."""
    drawn = _capture_figures(monkeypatch)
    results = {}
    for policy, factor in (("static", 1.0), ("elastic", 0.8), ("ppo", 0.8)):
        for seed in (0, 1):
            results[RunSpec(policy, "w", seed, "2x4", 0.0)] = {
                "metrics": {"avg_jct_s": 100.0 * factor}, "finished": True,
                "jcts_s": np.array([50.0, 100.0]) * factor,
                "series": {"t": [0.0, 60.0], "alloc_gpus": [4, 8 * factor],
                           "queued_jobs": [factor, 0]}}
    names = {"static": "static", "elastic": "elastic", "ppo": "ppo"}
    write_plots(results, names, tmp_path, reference="static")
    for png in ("jct_cdf.png", "gpu_util.png", "queue_length.png"):
        ax = drawn[png].axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines) == ["static", "elastic", "ppo (same as elastic)"], png
        assert [text.get_text() for text in ax.get_legend().get_texts()] == list(lines), png
        assert lines["static"].get_linestyle() == lines["elastic"].get_linestyle() == "-"
        assert lines["ppo (same as elastic)"].get_linestyle() != "-", png  # dashed over it


def test_curves_that_draw_one_line_are_the_same_whatever_their_points():
    """Runs ending at different times have series of different lengths, sampled at different
    steps: the same line all the same, and drawn solid one would hide the other."""
    zeros_3h = (np.array([0.0, 1.0, 2.0, 3.0]), np.zeros(4))
    zeros_6h = (np.array([0.0, 2.0, 4.0, 6.0]), np.zeros(4))
    rises_late = (np.array([0.0, 1.0, 2.0, 3.0, 4.0]), np.array([0.0, 0.0, 0.0, 0.0, 1.0]))
    assert same_curves({"a": zeros_3h, "b": zeros_6h, "c": rises_late}) == {"b": "a"}
    ramp = (np.array([0.0, 1.0, 2.0]), np.array([2.0, 1.0, 0.0]))
    sampled_less = (np.array([0.0, 2.0]), np.array([2.0, 0.0]))  # on the ramp's line
    assert same_curves({"a": ramp, "b": sampled_less}) == {"b": "a"}
    step = (np.array([1.0, 1.0, 2.0]), np.array([1 / 3, 2 / 3, 1.0]))  # a CDF's vertical step
    slope = (np.array([1.0, 2.0]), np.array([2 / 3, 1.0]))  # ends where the step does
    assert same_curves({"a": step, "b": slope, "c": step}) == {"c": "a"}


def test_queue_lines_of_runs_that_end_at_different_times_are_drawn_as_one(tmp_path,
                                                                         monkeypatch):
    """Two all-zero queues, one run ending 2 h later, drew over each other solid."""
    drawn = _capture_figures(monkeypatch)
    results = {}
    for policy, hours, queued in (("static", 2, 3.0), ("elastic", 2, 0.0), ("ppo", 4, 0.0)):
        t = np.arange(hours + 1) * 3600.0
        results[RunSpec(policy, "w", 0, "2x4", 0.0)] = {
            "metrics": {"avg_jct_s": 100.0 * hours}, "finished": True,
            "jcts_s": np.array([50.0 * hours]),
            "series": {"t": t, "alloc_gpus": 8 - t / 3600.0, "queued_jobs": np.full(
                hours + 1, queued)}}
    write_plots(results, {p: p for p in ("static", "elastic", "ppo")}, tmp_path)
    labels = {png: [line.get_label() for line in drawn[png].axes[0].get_lines()]
              for png in ("queue_length.png", "gpu_util.png")}
    assert labels["queue_length.png"] == ["static", "elastic", "ppo (same as elastic)"]
    # ppo's allocation goes on falling after static's run ends: a line of its own
    assert labels["gpu_util.png"] == ["static", "elastic (same as static)", "ppo"]


def _paired_runs(factor: float) -> tuple[dict[RunSpec, dict], dict[str, str]]:
    """Two seeds of static and of a policy at `factor` times static's avg JCT."""
    results = {}
    for policy, jct_factor in (("static", 1.0), ("other", factor)):
        for seed in (0, 1):
            jct = 1_000.0 * (1 + seed) * jct_factor
            results[RunSpec(policy, "w", seed, "2x4", 0.0)] = {
                "metrics": {"avg_jct_s": jct}, "finished": True, "jcts_s": np.array([jct]),
                "series": {"t": [0.0, 60.0], "alloc_gpus": [4, 8], "queued_jobs": [1, 0]}}
    return results, {"static": "static", "other": "other"}


@pytest.mark.parametrize("factor, change", [(1.00007, 0.007), (1.5, 50.0), (0.6, -40.0)])
def test_paired_axis_draws_a_negligible_change_small_and_a_large_one_whole(
        tmp_path, monkeypatch, factor, change):
    """Scaled to its data alone, +0.007 % took the whole width of the axis."""
    drawn = _capture_figures(monkeypatch)
    write_plots(*_paired_runs(factor), tmp_path, reference="static")
    ax = drawn[PAIRED_PLOT].axes[0]
    low, high = ax.get_xlim()
    assert ax.get_xscale() == "linear"
    assert low <= min(change, -PAIRED_MIN_SPAN_PCT)
    assert high >= max(change, PAIRED_MIN_SPAN_PCT)
    if abs(change) > 1:  # no wider than the data needs
        assert high - low < 1.5 * abs(change)


def test_equal_curves_take_turns_along_the_line():
    """Each of the equal curves drawn over the first shows in its own stretch."""
    x = np.array([0.0, 1.0])
    curves = {"a": (x, x), "b": (x, x), "c": (x, 2 * x), "d": (x, x)}
    assert same_curves(curves) == {"b": "a", "d": "a"}
    starts = set()
    for member in (1, 2):
        offset, (on, off) = _dash_style(member, 3)
        assert on + off == 3 * on
        starts.add((on + off - offset) % (on + off))
    assert len(starts) == 2 and 2 * on not in starts  # the last stretch is the solid one's


def _interrupt_at_second_figure(monkeypatch) -> None:
    """Ctrl-C while the plots are drawn, after the first figure was saved."""
    save = matplotlib.figure.Figure.savefig
    saved = []

    def savefig(fig, path, **kwargs):
        if saved:
            raise KeyboardInterrupt
        saved.append(path)
        save(fig, path, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)


def test_an_evaluate_stopped_while_writing_keeps_the_earlier_results_whole(
        tmp_path, monkeypatch, capsys):
    """results.json, results.md and plots are replaced together or not at all: a Ctrl-C among
    the plots left the new results beside the replaced run's plots."""
    out = tmp_path / "eval"
    run = [*EVALUATE, "--workload", "synthetic:8:1.0", "--out", str(out)]
    assert main(run) == 0
    earlier = files(out)
    _interrupt_at_second_figure(monkeypatch)
    assert main([*run, "--seeds", "1", "--force"]) == 130
    assert files(out) == earlier  # no staging directory left either
    fresh = tmp_path / "fresh" / "eval"
    assert main([*run[:-1], str(fresh)]) == 130
    assert not (tmp_path / "fresh").exists()  # nothing new behind
    capsys.readouterr()


TINY_WORKLOAD = "synthetic:12:3:3"


def _tiny_planner() -> LookaheadPolicy:
    """A planner over the size-estimating heuristics, its futures drawn from the tiny workload
    itself: a few contested decisions in well under a second, where `rlalloc planner fit`
    needs workloads with applications."""
    history = HistoryArrivals.of_scenarios([build_scenario(TINY_WORKLOAD, "1x4", seed=0)],
                                           3600.0, samples=1, seed=0)
    heuristics = [registry.load_policy(name)
                  for name in ("elastic-srpt-0.25", "elastic-srpt", "elastic")]
    return planning_policy(heuristics[0], heuristics[1:], history, "planner")


def test_evaluate_says_how_often_a_planner_left_its_base(tmp_path, monkeypatch, capsys):
    """As `rlalloc simulate` does: a planner that never deviated is its base at a second of
    simulation per contested decision. The counts sit beside ``policies``, which stays a
    mean and CI per metric."""
    load_policy = registry.load_policy
    monkeypatch.setattr(registry, "load_policy", lambda name: _tiny_planner()
                        if name == "planner" else load_policy(name))
    expected = {"contested": 0, "deviations": 0, "runs": 2}
    for seed in (0, 1):
        planner = _tiny_planner()
        scenario = build_scenario(TINY_WORKLOAD, "1x4", seed=seed)
        run_policy(scenario.simulator(SimParams(failures=FailureParams(failures_per_gpu_day=0.0)),
                                      seed=seed), planner.act)
        for key, count in lookahead_counts(planner).items():
            expected[key] += count
    assert expected["deviations"] > 0 and expected["contested"] > expected["deviations"]
    out = tmp_path / "eval"
    assert main(["evaluate", "--workload", TINY_WORKLOAD, "--cluster", "1x4", "--seeds", "2",
                 "--jobs", "1", "--failures", "none", "--policies", "elastic-srpt-0.25,planner",
                 "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert report["lookahead"] == {"planner": expected}
    assert all(set(metric) == {"mean", "ci95"} for metrics in report["policies"].values()
               for metric in metrics.values())
    assert (f"`planner` left its base at {expected['deviations']} of the "
            f"{expected['contested']} decisions where its heuristics' proposals differed "
            "(contested), summed over its 2 runs.") in (out / "results.md").read_text()
    capsys.readouterr()


def test_unfinished_runs_are_a_paragraph_of_their_own():
    """In Markdown a line directly under another joins its paragraph: the unfinished runs and
    the plots' names read as one sentence."""
    jcts = {("a", 0): 10.0, ("b", 0): 8.0}
    results = _runs(jcts)
    results[RunSpec("b", "w", 0, "2x4", 0.0)]["finished"] = False
    md = results_markdown(_report(results, {"a": "a", "b": "b"}), with_paired=False)
    unfinished = next(line for line in md.splitlines() if line.startswith("Runs stopped"))
    assert "'b': 1" in unfinished
    assert f"{unfinished}\n\nEach run's metrics: runs.csv. Plots: " in md


def test_results_show_a_workloads_loss_that_the_average_gain_hides():
    """b is 20 % faster than a on two workloads and 10 % slower on a third: the paired mean
    says -10 %, and only the per-workload table (and results.json) shows where b loses."""
    factors = {"w1": 0.8, "w2": 0.8, "w3": 1.1}
    results = {}
    for workload, factor in factors.items():
        for seed in (0, 1):
            for policy, jct in (("a", 1_000.0 * (seed + 1)), ("b", 1_000.0 * (seed + 1) * factor)):
                metrics = dict.fromkeys(METRIC_KEYS, 1.0) | {"avg_jct_s": jct}
                results[RunSpec(policy, workload, seed, "2x4", 0.0)] = {
                    "metrics": metrics, "finished": True, "lookahead": None}
    names = {"a": "a", "b": "b"}
    report = summarise(results, names, list(factors), [0, 1], "2x4", "none")
    report["paired"] = paired_changes(results, names, "a")
    assert report["paired"]["policies"]["b"]["avg_jct_s"]["mean"] == pytest.approx(-10.0)
    assert report["paired"]["avg_jct_by_workload"]["b"]["w3"]["runs_unfinished"] == 0
    by_workload = {w: c["mean"] for w, c in report["paired"]["avg_jct_by_workload"]["b"].items()}
    assert by_workload == pytest.approx({"w1": -20.0, "w2": -20.0, "w3": 10.0})
    md = results_markdown(report, with_paired=True)
    assert "| workload | b |" in md and "| w3 | +10.0% |" in md and "| w1 | -20.0% |" in md
    assert "n/a:" not in md.split("per workload")[1] and "unfinished:" not in md
    one = {spec: r for spec, r in results.items() if spec.workload == "w1"}
    assert workload_table(paired_changes(one, names, "a")) is None


def test_the_per_workload_table_flags_runs_that_left_jobs_unfinished():
    """A run stopped at the time limit averages only the jobs that finished: a policy that
    stalls looks fast (no job finished: avg JCT 0, "-100 %"). Its cell says so, and where the
    reference finished nothing there is no % to take."""
    results = {}
    for workload, (a_jct, b_jct, b_done) in {"ok": (1_000.0, 900.0, True),
                                            "stall": (1_000.0, 0.0, False),
                                            "ref-stall": (0.0, 500.0, True)}.items():
        for policy, jct, done in (("a", a_jct, workload != "ref-stall"), ("b", b_jct, b_done)):
            results[RunSpec(policy, workload, 0, "2x4", 0.0)] = {
                "metrics": dict.fromkeys(METRIC_KEYS, 1.0) | {"avg_jct_s": jct},
                "finished": done, "lookahead": None}
    table = workload_table(paired_changes(
        results, {"a": "a", "b": "b"}, "a"))
    assert "| ok | -10.0% |" in table
    assert "| stall | -100.0% (1 unfinished) |" in table
    assert "| ref-stall | n/a (1 unfinished) |" in table
    assert "\nn/a: `a`'s avg JCT there was 0" in table and "\nunfinished: runs" in table


def test_a_warning_of_the_command_is_in_results_md():
    results = {RunSpec("a", "w", 0, "2x4", 0.0): {
        "metrics": dict.fromkeys(METRIC_KEYS, 1.0), "finished": True, "lookahead": None}}
    report = _report(results, {"a": "a"})
    report["warnings"] = ["runs/p was fitted on w: ..."]
    assert "**Warning:** runs/p was fitted on w: ..." in results_markdown(report, False)


def test_paired_lost_gpu_hours_and_ettr_say_which_side_is_better():
    """Lost GPU-hours (lower is better, no % change against a reference that lost under one
    GPU-hour) and ETTR (higher is better) are compared run by run."""
    runs = _runs({("static", 0): 1.0, ("static", 1): 1.0, ("proactive", 0): 1.0,
                  ("proactive", 1): 1.0})
    lost = {("static", 0): 40.0, ("static", 1): 0.5, ("proactive", 0): 10.0,
            ("proactive", 1): 0.0}
    ettr = {("static", 0): 0.9, ("static", 1): 0.95, ("proactive", 0): 0.99,
            ("proactive", 1): 0.95}
    for spec, run in runs.items():
        run["metrics"]["lost_gpu_hours"] = lost[spec.policy, spec.seed]
        run["metrics"]["ettr"] = ettr[spec.policy, spec.seed]
    paired = paired_changes(runs, {"static": "static", "proactive": "proactive"}, "static")
    lost_change = paired["policies"]["proactive"]["lost_gpu_hours"]
    assert lost_change["mean"] == pytest.approx(-75.0)  # only seed 0: 0.5 GPU-h is negligible
    assert lost_change["better_runs"] == 2  # fewer GPU-hours lost on both runs
    assert paired["policies"]["proactive"]["ettr"]["better_runs"] == 1


class _Restarter:
    """First come first served, but at every decision point it first suspends a running job,
    which it then starts again: the clock moves by little more than the restores and no job
    ever finishes (the shipped DQN did this on the LLM fleet, restarting one job for ever)."""

    name = "restarter"

    def __init__(self) -> None:
        self._static = registry.load_policy("static")
        self._last_s: float | None = None

    def act(self, state: ClusterState) -> Action:
        if state.time_s != self._last_s:
            self._last_s = state.time_s
            running = np.flatnonzero(state.jobs.status == JobStatus.RUNNING)
            if len(running):
                return Action(ActionKind.SCALE, str(state.jobs.job_id[running[0]]))
        return self._static.act(state)


def test_a_run_that_restarts_a_job_at_every_decision_is_given_up(tmp_path, monkeypatch,
                                                                  capsys):
    """Without the bounds such a run goes on to the time limit; with them it ends once it is
    hopeless next to static (here by its jobs' time in the system, before 10 x 3 times
    static's decision points), reported as given up. Static's own row and the bounds are one
    run of it."""
    load_policy = registry.load_policy
    monkeypatch.setattr(registry, "load_policy", lambda name: _Restarter()
                        if name == "restarter" else load_policy(name))
    simulator, simulated = comparison_runs._simulator, []
    monkeypatch.setattr(comparison_runs, "_simulator",
                        lambda spec, efficiency: simulated.append(spec.policy)
                        or simulator(spec, efficiency))
    comparison_runs._static_run.cache_clear()
    out = tmp_path / "eval"
    assert main(["evaluate", "--workload", TINY_WORKLOAD, "--cluster", "1x4", "--seeds", "1",
                 "--jobs", "1", "--failures", "none", "--policies", "static,restarter",
                 "--out", str(out)]) == 0
    assert sorted(simulated) == ["restarter", "static"]
    report = json.loads((out / "results.json").read_text())
    assert report["runs_unfinished"] == {"static": 0, "restarter": 1}
    assert report["runs_given_up"] == {"static": 0, "restarter": 1}
    assert report["give_up_factor"] == 3.0
    static = run_policy(build_scenario(TINY_WORKLOAD, "1x4").simulator(
        SimParams(failures=FailureParams(failures_per_gpu_day=0.0))), load_policy("static").act)
    restarts = report["policies"]["restarter"]["restarts_per_job"]["mean"] * 12
    assert static.decisions < restarts <= 10 * 3 * static.decisions
    runs = (out / "runs.csv").read_text().splitlines()
    assert runs[0].startswith("policy,workload,seed,finished,given_up,")
    assert runs[2].startswith(f"restarter,{TINY_WORKLOAD},0,False,True,")
    assert "Of those, given up before the time limit: {'restarter': 1}: past 3 x static's" in (
        out / "results.md").read_text()
    capsys.readouterr()


@pytest.mark.parametrize("factor", ["0.5", "-1", "inf"])
def test_a_give_up_factor_that_would_give_up_runs_by_accident_is_refused(factor, tmp_path,
                                                                          capsys):
    assert main([*EVALUATE, "--give-up-factor", factor, "--out", str(tmp_path / "eval")]) == 2
    assert not (tmp_path / "eval").exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --give-up-factor: " in err
