"""Statistical efficiency on clusters that mix GPU types (Sia's world): goodput per type from
each type's profile with the model's one gradient noise, every type's curve refreshed at epoch
ends, the fallback for an unmeasured type, Sia's categories that keep their batch size, and
whole runs that conserve GPUs and work and repeat by seed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.registry import load_policy
from rlalloc.cli.main import main
from rlalloc.env.cluster import parse_cluster
from rlalloc.env.efficiency import (
    AdaptiveBatchGoodput,
    FixedBatchGoodput,
    ScaledGoodput,
    goodput_speeds,
)
from rlalloc.env.failures import FailureParams
from rlalloc.env.gpu_types import RELATIVE_SPEED
from rlalloc.env.params import SimParams
from rlalloc.env.profiles import DEFAULT_PROFILES_ROOT, load_profiles
from rlalloc.env.scenario import build_scenario, job_speeds
from rlalloc.env.simulator import Simulator
from rlalloc.env.workload.spec import JobSpec, Workload

from sim_helpers import WorkLedger, check_accounting, check_invariants, place_on_type

MIXED = "1x4:T4+1x4:A100"
NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
SIA_ROWS = ("name,time,application,num_replicas,batch_size,category\n"
            "a,0,cifar10,2,1024,adaptive\nblank,5,cifar10,2,1024,\n"
            "s,10,cifar10,2,1024,scale-gpus\nr,20,cifar10,2,1024,rigid\n")


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(DEFAULT_PROFILES_ROOT)


def _sim(profiles, cluster: str, mode: str, jobs: list[tuple[str, str, int, int]]) -> Simulator:
    """A simulator over (job id, application, batch size, GPUs) jobs under `mode`."""
    spec = parse_cluster(cluster)
    workload = Workload("w", tuple(
        JobSpec(job_id, 0.0, gpus, profiles[app].work_iterations(batch), 1,
                profiles[app].max_workers(batch), 50.0, app, batch)
        for job_id, app, batch, gpus in jobs))
    types = [node.gpu_type for node in spec.nodes]
    workload, speeds = goodput_speeds(workload, profiles, mode, job_speeds(workload, profiles,
                                                                           types),
                                      spec.total_gpus, types)
    return Simulator(spec, workload, speeds, NO_FAILURES)


def _rates(sim: Simulator) -> dict[str, float]:
    return dict(zip(sim.job_ids, sim.columns.rate.tolist(), strict=True))


@pytest.mark.parametrize("app,batch", [("bert", 96), ("imagenet", 800)])
def test_a_fixed_batch_job_on_a100_outruns_t4_by_the_profiles_ratio(profiles, app, batch):
    """At a fixed batch size a step buys the same progress on any GPU, so in every epoch
    goodput on A100 over T4 is exactly the ratio of the two profiles' step rates, and the
    simulator trains each job at its type's goodput in its current epoch."""
    sim = _sim(profiles, MIXED, "fixed", [("a", app, batch, 2), ("t", app, batch, 2)])
    on = profiles[app].on_type
    expected = (on["A100"].throughput(batch).iterations_per_s((2,))
                / on["T4"].throughput(batch).iterations_per_s((2,)))
    assert expected > 1.5
    speed = sim._speeds[0]
    a100, t4 = speed.on_type("A100").epochs, speed.on_type("T4").epochs
    for epoch in range(len(t4.epoch_ends)):
        assert (a100.progress_per_s((2,), epoch) / t4.progress_per_s((2,), epoch)
                == pytest.approx(expected, rel=1e-9))
    sim.advance()
    place_on_type(sim, "a", 2, "A100")
    place_on_type(sim, "t", 2, "T4")
    sim.advance()
    sim.advance()  # both restored and training
    stall = sim.params.checkpoint_interval_s / (sim.params.checkpoint_interval_s
                                                + sim.params.checkpoint_stall_s)
    rate = _rates(sim)
    for job_id, rates in (("a", a100), ("t", t4)):
        row = sim.job_ids.index(job_id)
        epoch = rates.epoch_at(sim.columns.done[row])
        assert rate[job_id] == pytest.approx(rates.progress_per_s((2,), epoch) * stall,
                                             rel=1e-9)


def test_an_adaptive_job_runs_each_types_best_batch_size(profiles):
    """On each type an adaptive job trains at that type's best batch size for the epoch (the
    best one differs when step times scale differently), and the state shows each type's
    goodput curve."""
    sim = _sim(profiles, MIXED, "adaptive", [("a", "cifar10", 128, 2), ("t", "cifar10", 128, 2)])
    sim.advance()
    place_on_type(sim, "a", 2, "A100")
    place_on_type(sim, "t", 2, "T4")
    sim.advance()  # both restored and training
    rate = _rates(sim)
    stall = sim.params.checkpoint_interval_s / (sim.params.checkpoint_interval_s
                                                + sim.params.checkpoint_stall_s)
    speed = sim._speeds[0]
    for job_id, gpu_type in (("a", "A100"), ("t", "T4")):
        rates = speed.on_type(gpu_type).epochs
        assert isinstance(rates, AdaptiveBatchGoodput)
        epoch = rates.epoch_at(sim.columns.done[sim.job_ids.index(job_id)])
        profile = profiles["cifar10"].on_type[gpu_type]
        best = max(profile.throughput(b).iterations_per_s((2,)) * rates.noise.gain(b, epoch)
                   for b in rates.candidates if b >= 2 * profile.min_local_bsz)
        assert rate[job_id] == pytest.approx(best * stall, rel=1e-9)
    sim = _sim(profiles, MIXED, "adaptive", [("a", "cifar10", 128, 2)])
    sim.advance()
    speed = sim._speeds[0]
    state = sim.state()
    table = state.type_speeds
    for column, gpu_type in enumerate(table.gpu_types):
        single, alpha, beta = speed.on_type(gpu_type).epochs.curve(0)
        assert table.speed_1gpu[0, column] == pytest.approx(single, rel=1e-6)
        assert table.scaling_alpha[0, column] == pytest.approx(alpha, rel=1e-5, abs=1e-7)


def test_every_types_curve_follows_the_epochs_and_work_is_conserved(profiles):
    """A job training on T4 through many epochs: what policies see of A100 (where it does not
    run) changes with its epochs too, and it finishes exactly at the sum of its epochs."""
    sim = _sim(profiles, MIXED, "adaptive", [("t", "cifar10", 128, 4)])
    sim.advance()
    place_on_type(sim, "t", 4, "T4")
    rates = {t: sim._speeds[0].on_type(t).epochs for t in ("T4", "A100")}
    a100 = sim.state().type_speeds.column("A100")
    seen = set()
    while not sim.done:
        state = sim.state()
        check_invariants(state)
        if state.jobs.count:
            epoch = rates["A100"].epoch_at(sim.columns.done[0])
            single = rates["A100"].curve(epoch)[0]
            assert state.type_speeds.speed_1gpu[0, a100] == pytest.approx(single, rel=1e-6)
            seen.add(single)
        sim.advance()
    assert len(seen) >= 3
    t4 = rates["T4"]
    spans = np.diff(np.concatenate([[0.0], t4.epoch_ends]))
    stall = sim.params.checkpoint_interval_s / (sim.params.checkpoint_interval_s
                                                + sim.params.checkpoint_stall_s)
    expected = sum(span / (t4.progress_per_s((4,), e) * stall)  # a first start restores nothing
                   for e, span in enumerate(spans))
    assert sim.accounting.summary()["avg_jct_s"] == pytest.approx(expected, rel=1e-6)


def test_an_unmeasured_type_scales_the_nearest_measured_goodput(profiles):
    """gpt_pmp was never measured on T4 and no application on H100: their goodput is the
    nearest measured type's times the two types' relative speed, as their step rates are."""
    sim = _sim(profiles, "1x8:T4+1x8:A100+1x8:H100", "adaptive",
               [("g", "gpt_pmp", 96, 8), ("b", "bert", 96, 2)])
    gpt, bert = sim._speeds
    scaled = gpt.on_type("T4").epochs
    assert isinstance(scaled, ScaledGoodput)
    nearest = scaled.rates.profile.gpu_type
    assert nearest in profiles["gpt_pmp"].on_type
    assert scaled.factor == pytest.approx(RELATIVE_SPEED["T4"] / RELATIVE_SPEED[nearest])
    h100 = bert.on_type("H100").epochs
    assert isinstance(h100, ScaledGoodput) and h100.rates.profile.gpu_type == "A100"
    for epoch in range(len(h100.epoch_ends)):
        assert h100.progress_per_s((2,), epoch) == pytest.approx(
            RELATIVE_SPEED["H100"] / RELATIVE_SPEED["A100"]
            * bert.on_type("A100").epochs.progress_per_s((2,), epoch), rel=1e-12)


def test_sias_scale_gpus_and_rigid_jobs_keep_their_batch_size(tmp_path):
    """Sia's simulator tunes batch sizes for adaptive jobs only: under `--efficiency adaptive`
    scale-gpus and rigid jobs run fixed, the others adaptive (and only they may grow past the
    GPUs their batch size feeds)."""
    csv = tmp_path / "sia.csv"
    csv.write_text(SIA_ROWS)
    scenario = build_scenario(str(csv), "6x4:T4+3x8:RTX2080Ti+2x8:A100", efficiency="adaptive")
    kinds = {job.job_id: (type(speed.on_type("A100").epochs), job.max_workers)
             for job, speed in zip(scenario.workload.jobs, scenario.speeds, strict=True)}
    plain = {job.job_id: job.max_workers for job in build_scenario(
        str(csv), "6x4:T4+3x8:RTX2080Ti+2x8:A100").workload.jobs}
    assert kinds["a"][0] is kinds["blank"][0] is AdaptiveBatchGoodput
    assert kinds["s"][0] is kinds["r"][0] is FixedBatchGoodput
    assert kinds["a"][1] > plain["a"] and kinds["blank"][1] > plain["blank"]
    assert kinds["s"][1] == plain["s"] > 2 and kinds["r"][1] == plain["r"] == 2


@pytest.mark.parametrize("policy", ["sia", "gavel"])
def test_whole_runs_on_a_mixed_cluster_conserve_gpus_and_work_and_repeat(tmp_path, policy):
    csv = tmp_path / "w.csv"
    csv.write_text("name,time,application,num_replicas,batch_size\n" + "".join(
        f"j{i},{60 * i},{app},{gpus},{batch}\n" for i, (app, gpus, batch) in enumerate(
            [("cifar10", 2, 256), ("bert", 4, 96), ("ncf", 1, 2048), ("imagenet", 4, 800),
             ("deepspeech2", 2, 40), ("yolov3", 4, 64), ("cifar10", 1, 128)] * 2)))
    results = []
    for _ in range(2):
        scenario = build_scenario(str(csv), "2x4:T4+1x8:RTX2080Ti+1x8:A100",
                                  efficiency="adaptive")
        sim = scenario.simulator(NO_FAILURES, seed=3)
        decide = load_policy(policy).act
        ledger = WorkLedger(sim)

        def checked(state, decide=decide, sim=sim, ledger=ledger):
            check_invariants(state)
            check_accounting(sim, state)
            ledger.check(state)
            for placement in state.jobs.placement:
                assert len({state.nodes.gpu_type[n] for n in placement}) <= 1
            return decide(state)

        result = run_policy(sim, checked)
        assert result.finished
        results.append(result.jcts_s)
    assert results[0] == results[1]


def test_evaluate_runs_sia_adaptive_against_gavel_fixed_as_sias_simulator_does(tmp_path):
    """Sia's own comparison in one table: sia's jobs tune their batch sizes, Gavel's keep
    theirs (its artifact disables tuning for gavel)."""
    csv = tmp_path / "w.csv"
    csv.write_text("name,time,application,num_replicas,batch_size\n" + "".join(
        f"j{i},{120 * i},{app},{gpus},{batch}\n" for i, (app, gpus, batch) in enumerate(
            [("cifar10", 2, 256), ("bert", 4, 96), ("imagenet", 4, 800), ("yolov3", 4, 64)])))
    out = tmp_path / "eval"
    assert main(["evaluate", "--workload", str(csv), "--cluster", "1x4:T4+1x8:A100",
                 "--policies", "sia,gavel@fixed", "--reference", "gavel@fixed",
                 "--efficiency", "adaptive", "--failures", "none", "--seeds", "1",
                 "--jobs", "1", "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert report["efficiency"] == "adaptive"
    assert set(report["policies"]) == {"sia", "gavel@fixed"}


def test_evaluate_warns_where_a_size_table_knows_none_of_the_jobs(tmp_path, capsys):
    """A size table keys jobs by the curve they show, and under statistical efficiency that is
    a goodput curve no table fitted on plain runs holds: the size-told policy then runs as its
    base heuristic, which `evaluate` says rather than reporting it under its own label."""
    from rlalloc.agent.registry import told_size_table

    csv = tmp_path / "w.csv"
    csv.write_text("name,time,application,num_replicas,batch_size\n"
                   "a,0,cifar10,2,256\nb,60,bert,4,96\nc,120,cifar10,1,256\n")
    sized = tmp_path / "sized"
    assert main(["sizes", "fit", "--workload", str(csv), "--cluster", MIXED, "--base", "sia",
                 "--out", str(sized)]) == 0
    table = told_size_table(str(sized))
    assert table is not None and told_size_table("sia") is None
    assert told_size_table("ppo") is not None  # the shipped PPO is told sizes too
    plain = build_scenario(str(csv), MIXED)
    assert table.known_jobs(plain) == 3
    assert table.known_jobs(build_scenario(str(csv), MIXED, efficiency="adaptive")) == 0
    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["evaluate", "--workload", str(csv), "--cluster", MIXED, "--policies",
                 f"sia,{sized},{sized}@adaptive", "--failures", "none", "--seeds", "1",
                 "--jobs", "1", "--out", str(out)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("rlalloc: warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"rlalloc: warning: {sized}@adaptive: its size table knows "
                                  f"none of the jobs of {csv} (under --efficiency adaptive")
    report = json.loads((out / "results.json").read_text())
    assert report["warnings"] == [warnings[0].removeprefix("rlalloc: warning: ")]


def test_a_table_fitted_under_efficiency_knows_jobs_in_every_epoch(tmp_path, capsys):
    """Fitted under the same mode (`sizes fit --efficiency`), the table keys each kind by every
    epoch's goodput curve, so it knows a job all the way through; a base that would rank growth
    by copied step-rate profiles is refused under efficiency."""
    from rlalloc.agent.job_sizes import JobSizeHistory

    csv = tmp_path / "w.csv"
    csv.write_text("name,time,application,num_replicas,batch_size\n"
                   "a,0,cifar10,2,256\nb,60,deepspeech2,2,40\nc,120,cifar10,1,128\n")
    scenario = build_scenario(str(csv), MIXED, efficiency="adaptive")
    table = JobSizeHistory.fit([scenario])
    # adaptive work does not depend on the batch size: one kind per application
    assert table.kind_count == 2 and table.past_jobs == 3
    assert len(table.work_s) > table.kind_count
    sim = scenario.simulator(NO_FAILURES, seed=0)
    decide = load_policy("sia").act
    epochs_seen = set()

    def checked(state):
        rows = np.arange(state.jobs.count)
        assert np.isfinite(table.remaining_work(state, rows)).all()
        epochs_seen.update(int(sim._speeds[sim.job_ids.index(j)].epochs.epoch_at(
            sim.columns.done[sim.job_ids.index(j)])) for j in state.jobs.job_id)
        return decide(state)

    assert run_policy(sim, checked).finished
    assert len(epochs_seen) >= 3
    assert main(["sizes", "fit", "--workload", str(csv), "--cluster", MIXED,
                 "--efficiency", "adaptive", "--out", str(tmp_path / "elastic")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use --speeds curves (or --base sia)" in err[0]
    assert not (tmp_path / "elastic").exists()
    assert main(["sizes", "fit", "--workload", str(csv), "--cluster", MIXED, "--efficiency",
                 "adaptive", "--speeds", "curves", "--out", str(tmp_path / "elastic")]) == 0
    assert "(2 job kinds, 3 past jobs)" in capsys.readouterr().out
