"""Fast tests of the trainer's pure parts: data order, checkpoint layout, flags, resume rule,
setup errors, manifests and the image they run, and the recovery benchmark's work directory."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import socket
import subprocess
import sys
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from torch.distributed.run import get_args_parser

from rlalloc.actuator.crd_schema import PyTorchJobValidationError, file_validator
from rlalloc.actuator.twin.kube_api import INSTALLED_CRD_FILE
from rlalloc.cli import bench_recovery
from rlalloc.cli.main import main as rlalloc_main
from rlalloc.env.errors import UserError
from rlalloc.env.telemetry_names import (
    MANAGED_LABEL,
    TRAINER_LAST_CHECKPOINT_STEP,
    TRAINER_LAST_CHECKPOINT_TIME,
    TRAINER_STEP,
    TRAINER_TOTAL_STEPS,
    TRAINER_WORLD_SIZE,
)
from rlalloc.trainer_jobs import layout
from rlalloc.trainer_jobs.config import (
    TrainConfig,
    add_train_arguments,
    config_from_args,
    resume_conflicts,
)
from rlalloc.trainer_jobs.data import DataPosition, GlobalBatchSampler, rank_slice, sample_tokens
from rlalloc.trainer_jobs.metrics import TrainerMetrics
from rlalloc.trainer_jobs.model import ModelConfig, format_count
from rlalloc.trainer_jobs.train import _open_outputs, main

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "trainer_jobs" / "manifests"


def test_rank_slices_partition_the_global_batch():
    batch = list(range(100, 107))
    for world_size in (1, 2, 3, 7):
        slices = [rank_slice(batch, rank, world_size) for rank in range(world_size)]
        assert sum(slices, []) == batch
        assert max(map(len, slices)) - min(map(len, slices)) <= 1


def test_epoch_is_a_permutation_whatever_the_world_size_history():
    sampler = GlobalBatchSampler(num_samples=50, global_batch=8, seed=3)
    position, seen = DataPosition(0, 0), []
    # World size changes between steps must not matter: ranks only slice the global batch.
    for step, world_size in enumerate([2, 2, 1, 1, 3, 2]):
        batch = sampler.global_batch_indices(position)
        seen += sum((rank_slice(batch, r, world_size) for r in range(world_size)), [])
        position = sampler.advance(position)
        assert position.epoch == (0 if step < 5 else 1)
    assert len(seen) == len(set(seen)) == 48  # 50 // 8 full batches, tail dropped
    assert sampler.permutation(1) != sampler.permutation(0)


def test_samples_are_deterministic_arithmetic_sequences():
    tokens = sample_tokens([5, 9], seed=1, seq_len=6, vocab_size=64)
    assert tokens.shape == (2, 7)
    assert (tokens == sample_tokens([5, 9], seed=1, seq_len=6, vocab_size=64)).all()
    stride = (tokens[:, 1] - tokens[:, 0]) % 64
    assert ((tokens[:, 1:] - tokens[:, :-1]) % 64 == stride.unsqueeze(1)).all()


def _fake_checkpoint(root: Path, step: int) -> Path:
    tmp = root / layout.tmp_dir_name(step)
    tmp.mkdir(parents=True)
    (tmp / ".metadata").write_bytes(b"meta")
    (tmp / "__0_0.distcp").write_bytes(bytes(range(256)) * 4)
    return layout.commit(tmp, step, world_size=2, rng_ranks=[0, 1], config={"seed": 0})


def test_commit_verify_and_uncommitted_tmp_is_ignored(tmp_path):
    committed = _fake_checkpoint(tmp_path, 10)
    assert committed.name == "step-000000010"
    crashed = tmp_path / layout.tmp_dir_name(20)  # a save that died before its commit
    crashed.mkdir()
    (crashed / ".metadata").write_bytes(b"x")
    info, problems = layout.latest_valid(tmp_path)
    assert (info.step, info.rng_ranks, problems) == (10, (0, 1), [])


@pytest.mark.parametrize("damage", ["truncate", "flip", "marker", "config", "files"])
def test_damaged_checkpoint_falls_back_to_previous(tmp_path, damage):
    _fake_checkpoint(tmp_path, 10)
    newest = _fake_checkpoint(tmp_path, 20)
    data = newest / "__0_0.distcp"
    marker_path = newest / layout.COMMIT_MARKER
    marker = json.loads(marker_path.read_text())
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "flip":
        data.write_bytes(b"\xff" + data.read_bytes()[1:])
    elif damage == "marker":
        marker_path.write_text("{not json")
    elif damage == "config":  # valid JSON, a field missing: skipped, not a crash on restart
        del marker["config"]
        marker_path.write_text(json.dumps(marker))
    else:
        marker["files"]["__0_0.distcp"] = {"size": 1024}
        marker_path.write_text(json.dumps(marker))
    info, problems = layout.latest_valid(tmp_path)
    assert info.step == 10 and len(problems) == 1
    assert (tmp_path / "step-000000020.corrupt").is_dir()  # kept for inspection, not deleted


def test_a_marker_the_storage_cannot_read_now_is_not_quarantined(tmp_path, monkeypatch):
    # EIO on the newest marker set that valid checkpoint aside for good (the same error on a
    # data file stopped the start instead, moving nothing): storage errors are not corruption
    import errno

    _fake_checkpoint(tmp_path, 10)
    newest = _fake_checkpoint(tmp_path, 20)
    read_text = Path.read_text

    def failing(path: Path, *args: object, **kwargs: object) -> str:
        if path == newest / layout.COMMIT_MARKER:
            raise OSError(errno.EIO, "Input/output error")
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", failing)
    with pytest.raises(OSError, match="Input/output error"):
        layout.latest_valid(tmp_path)
    monkeypatch.undo()
    assert newest.is_dir() and layout.latest_valid(tmp_path)[0].step == 20
    # a marker that is a directory is the checkpoint's fault, not the storage's: quarantined
    (newest / layout.COMMIT_MARKER).unlink()
    (newest / layout.COMMIT_MARKER).mkdir()
    info, problems = layout.latest_valid(tmp_path)
    assert info.step == 10 and len(problems) == 1


def test_quarantined_dirs_lists_only_corrupt_checkpoints(tmp_path):
    _fake_checkpoint(tmp_path, 10)
    for name in ("step-000000020.corrupt", "step-000000020.corrupt.1", "step-000000030.tmp"):
        (tmp_path / name).mkdir()
    assert [p.name for p in layout.quarantined_dirs(tmp_path)] == [
        "step-000000020.corrupt", "step-000000020.corrupt.1"]
    assert layout.quarantined_dirs(tmp_path / "missing") == []


def test_prune_keeps_newest_and_removes_stale_tmp(tmp_path):
    for step in (10, 20, 30, 40):
        _fake_checkpoint(tmp_path, step)
    (tmp_path / layout.tmp_dir_name(35)).mkdir()
    (tmp_path / layout.tmp_dir_name(50)).mkdir()  # possibly in flight: kept
    layout.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000030", "step-000000040", "step-000000050.tmp"]


@pytest.mark.parametrize("flags, fragment", [
    (["--global-batch", "0"], "--global-batch"),
    (["--d-model", "30", "--n-heads", "4"], "--d-model"),
    (["--keep-last", "0"], "--keep-last"),
    (["--seed", "5000000000"], "--seed 5000000000: must be within"),
    (["--seed", "-1"], "--seed -1: must be within"),
])
def test_bad_flag_is_one_line_and_exit_2(flags, fragment, capsys, tmp_path):
    assert main([*flags, "--checkpoint-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err


def test_checkpoint_dir_that_is_a_file_is_rejected(capsys, tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["--checkpoint-dir", str(target)]) == 2
    assert capsys.readouterr().err == (f"trainer: error: --checkpoint-dir {target} is a file; "
                                       "pass a directory\n")


def test_resume_conflicts_name_data_settings_and_allow_elastic_ones():
    saved = TrainConfig(model=ModelConfig(d_model=32, n_heads=2), num_samples=256)
    elastic = replace(saved, max_steps=9, parallelism="fsdp", checkpoint_dir=Path("moved"),
                      checkpoint_every_steps=1, checkpoint_every_s=5.0, checkpoint_mode="sync",
                      keep_last=9, sigterm_grace_s=1.0, metrics_port=9400, job_name="j",
                      namespace="n", log_jsonl=Path("other.jsonl"))
    assert resume_conflicts(saved.to_json_dict(), elastic.to_json_dict()) == []
    changed = replace(saved, model=replace(saved.model, d_model=64), global_batch=4,
                      num_samples=16, seed=7, lr=1e-3)
    assert resume_conflicts(saved.to_json_dict(), changed.to_json_dict()) == [
        "--d-model 32 (flags: 64)", "--global-batch 8 (flags: 4)",
        "--num-samples 256 (flags: 16)", "--seed 0 (flags: 7)", "--lr 0.0003 (flags: 0.001)"]
    assert "--seed None (flags: 0)" in resume_conflicts({}, saved.to_json_dict())


def test_setup_problems_are_one_line_errors_naming_the_flag(tmp_path):
    base = TrainConfig(model=ModelConfig(), checkpoint_dir=tmp_path / "ckpt")
    (tmp_path / "file").write_text("x")
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        cases = {"--checkpoint-dir": replace(base, checkpoint_dir=tmp_path / "file" / "ckpt"),
                 "--log-jsonl": replace(base, log_jsonl=tmp_path / "nodir" / "x.jsonl"),
                 "--metrics-port": replace(base, metrics_port=taken.getsockname()[1])}
        for flag, config in cases.items():
            with pytest.raises(UserError, match=flag) as refused:
                _open_outputs(config, rank=0)
            assert "\n" not in str(refused.value)


def test_existing_checkpoint_dir_that_cannot_be_written_is_refused_at_start():
    unwritable = Path("/proc")  # a directory that exists and that not even root can write into
    with pytest.raises(UserError, match="--checkpoint-dir /proc") as refused:
        _open_outputs(TrainConfig(model=ModelConfig(), checkpoint_dir=unwritable), rank=0)
    assert "\n" not in str(refused.value)


def _exported(metrics: TrainerMetrics) -> dict[str, float]:
    """Series name -> value of everything the exporter would serve."""
    return {sample.name: sample.value for family in metrics.registry.collect()
            for sample in family.samples}


def test_metrics_show_a_resumed_job_at_its_step_and_checkpoint_never_at_zero():
    fresh = TrainerMetrics("lm", "default", total_steps=100)
    # before anything is known, nothing but the configured total: a 0 step or checkpoint time
    # would read as "progress lost" and "checkpoint taken in 1970" to the actuator
    assert _exported(fresh) == {TRAINER_TOTAL_STEPS: 100.0}
    fresh.on_resumed(0, world_size=2, checkpoint_step=0, started_unix=1.6e9)
    exported = _exported(fresh)  # a fresh start: a restart would resume from step 0, its start
    assert exported[TRAINER_LAST_CHECKPOINT_STEP] == 0.0
    assert exported[TRAINER_LAST_CHECKPOINT_TIME] == 1.6e9
    resumed = TrainerMetrics("lm", "default", total_steps=100)
    resumed.on_resumed(40, world_size=2, checkpoint_step=40, started_unix=1.7e9)
    exported = _exported(resumed)
    assert exported[TRAINER_STEP] == 40.0 and exported[TRAINER_WORLD_SIZE] == 2.0
    assert exported[TRAINER_LAST_CHECKPOINT_STEP] == 40.0
    assert exported[TRAINER_LAST_CHECKPOINT_TIME] == 1.7e9


def test_bench_recovery_refuses_a_used_work_dir(tmp_path, capsys):
    (tmp_path / "recovery.jsonl").write_text('{"event": "start"}\n')  # a previous run's log
    assert rlalloc_main(["bench", "recovery", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--work-dir" in err and "Traceback" not in err
    assert "not an empty directory" in err
    assert rlalloc_main(["bench", "recovery", "--work-dir", str(tmp_path / "recovery.jsonl")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("workers, per_worker", [(1, 1), (4, 4), (2, 0)])
def test_bench_recovery_refuses_a_world_it_cannot_kill_a_process_of_or_feed(capsys, workers,
                                                                           per_worker):
    # one process has nothing to recover with; more than the global batch of 8 leaves ranks
    # without a sample
    assert rlalloc_main(["bench", "recovery", "--workers", str(workers),
                         "--nproc-per-node", str(per_worker)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"--workers {workers} x --nproc-per-node {per_worker}: need" in err


def test_bench_recovery_removes_its_temporary_work_dir_after_a_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    used: list[Path] = []

    def failing_phase(work_dir: Path, *args: object) -> None:
        (work_dir / "ckpt-sync").mkdir()
        used.append(work_dir)
        raise RuntimeError("stall run (sync) failed")

    monkeypatch.setattr(bench_recovery, "_stall_phase", failing_phase)
    with pytest.raises(RuntimeError, match=r"^stall run \(sync\) failed$"):  # the phase's own
        rlalloc_main(["bench", "recovery"])
    assert used and not used[0].exists()


@pytest.mark.timeout(60)
def test_bench_recovery_reads_a_failed_runs_long_stderr_without_blocking(tmp_path, monkeypatch):
    """A child that writes more than a pipe holds (64 KB) before it exits would block on a
    pipe read only at the end, and the benchmark with it."""
    from rich.progress import Progress

    popen = subprocess.Popen
    noisy = "import sys; sys.stderr.write('w' * 200_000 + 'LAST'); sys.exit(1)"
    monkeypatch.setattr(subprocess, "Popen",
                        lambda command, **kw: popen([sys.executable, "-c", noisy], **kw))
    with pytest.raises(RuntimeError, match="stall run \\(sync\\) failed: w+LAST$"):
        bench_recovery._stall_phase(tmp_path, "sync", 1, Progress())


def _pytorchjobs() -> list[dict]:
    docs = [d for p in sorted(MANIFESTS.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    return [d for d in docs if d.get("kind") == "PyTorchJob"]


def test_manifests_match_the_crd_and_rlalloc_conventions():
    jobs = _pytorchjobs()
    assert jobs
    for job in jobs:
        file_validator(INSTALLED_CRD_FILE)(job)  # the Training Operator's own CRD
        assert job["metadata"]["labels"][MANAGED_LABEL] == "true"
        elastic = job["spec"]["elasticPolicy"]
        assert elastic["rdzvBackend"] == "c10d" and elastic["minReplicas"] <= elastic["maxReplicas"]
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        command = pod["containers"][0]["command"]
        grace_s = float(next(a.split("=")[1] for a in command if a.startswith("--sigterm-grace-s")))
        shutdown_s = float(next(a.split("=")[1] for a in command if a.startswith("--shutdown-t")))
        # kubelet waits for torchrun, which waits for the trainer's final checkpoint
        assert grace_s < shutdown_s < pod["terminationGracePeriodSeconds"]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims and all(c for c in claims)


def _container(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


def _trainer_config(launch: argparse.Namespace) -> TrainConfig:
    """The trainer's configuration from a parsed torchrun command line."""
    trainer_flags = argparse.ArgumentParser(exit_on_error=False)
    add_train_arguments(trainer_flags)
    return config_from_args(trainer_flags.parse_args(launch.training_script_args))


def test_manifest_workers_hold_a_gpu_per_process_and_the_batch_fits_the_largest_world():
    for job in _pytorchjobs():
        per_worker = int(job["spec"]["nprocPerNode"])
        resources = _container(job)["resources"]
        assert per_worker > 1  # the example is a multi-GPU worker
        assert resources["requests"]["nvidia.com/gpu"] == per_worker
        assert resources["limits"]["nvidia.com/gpu"] == per_worker
        command = _container(job)["command"]
        # the operator's PET_NNODES (elasticPolicy, in workers) and PET_NPROC_PER_NODE apply
        assert not [a for a in command if a.startswith(("--nnodes", "--nproc"))]
        largest_world = job["spec"]["elasticPolicy"]["maxReplicas"] * per_worker
        config = _trainer_config(get_args_parser().parse_args(command[1:]))
        assert config.global_batch >= largest_world  # every rank gets a sample per step


def test_manifest_command_runs_in_the_trainer_image():
    # torchrun is the pinned torch's console script; the module and its flags are the trainer's
    assert any(e.name == "torchrun" and e.dist.name == "torch"
               for e in importlib.metadata.entry_points(group="console_scripts"))
    for job in _pytorchjobs():
        command = _container(job)["command"]
        assert command[0] == "torchrun"
        launch = get_args_parser().parse_args(command[1:])
        assert launch.module and launch.training_script == "rlalloc.trainer_jobs.train"
        module = importlib.util.find_spec(launch.training_script)
        assert Path(module.origin).is_relative_to(REPO / "trainer_jobs")  # the image copies it
        _trainer_config(launch)


def test_validator_names_the_bad_and_the_unknown_fields(tmp_path):
    job = _pytorchjobs()[0]
    job["spec"]["elasticPolicy"]["maxReplicas"] = "four"
    job["spec"]["elasticPolicy"]["maxReplica"] = 4  # misspelt: the API server would drop it
    with pytest.raises(PyTorchJobValidationError, match=(
            r"^PyTorchJob \S+ violates the CRD schema \(.*\): "
            r"spec\.elasticPolicy\.maxReplica: unknown field; "
            r"spec\.elasticPolicy\.maxReplicas: 'four' is not of type 'integer'$")):
        file_validator(INSTALLED_CRD_FILE)(job)
    with pytest.raises(UserError, match="cannot read the PyTorchJob CRD at .*RLALLOC_CRD_PATH"):
        file_validator(tmp_path / "missing.yaml")


def test_layout_marker_records_checksums(tmp_path):
    committed = _fake_checkpoint(tmp_path, 5)
    marker = json.loads((committed / layout.COMMIT_MARKER).read_text())
    assert set(marker["files"]) == {".metadata", "__0_0.distcp"}
    assert marker["files"]["__0_0.distcp"] == {
        "bytes": 1024, "crc32": zlib.crc32((committed / "__0_0.distcp").read_bytes())}


def test_parameter_counts_read_well_at_every_size():
    assert [format_count(n) for n in (830, 17_088, 999_960, 21_037_056, 1_230_000_000)] == [
        "830", "17.1k", "1.0M", "21.0M", "1.2B"]


def test_bench_recovery_removes_its_temporary_work_dir_on_sigterm():
    """SIGTERM (`timeout`, a cancelled CI job) ended the process where it stood and left the
    benchmark's ~2 GB of checkpoints in /tmp. (In a child process: without the fix the signal
    would end the test session itself.)"""
    import signal
    import subprocess
    import sys

    script = ("import os, signal\n"
              "from rlalloc.cli.bench_recovery import _work_dir\n"
              "with _work_dir(None) as work_dir:\n"
              "    (work_dir / 'checkpoint').write_bytes(b'x' * 1024)\n"
              "    print(work_dir, flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    signal.pause()\n")
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60, cwd=Path(__file__).resolve().parents[1])
    work_dir = Path(child.stdout.strip())
    assert child.returncode == 128 + signal.SIGTERM, child.stderr
    assert work_dir.name.startswith("rlalloc-bench-recovery-") and not work_dir.exists()
