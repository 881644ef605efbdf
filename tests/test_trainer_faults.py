"""Fault tests that really train: torchrun with local gloo CPU workers, killed, signalled, resized.

The model is tiny so each run takes seconds; what is checked is the bookkeeping a real job
depends on — step continuity, no sample seen twice within an epoch, the checkpoint a restart
loads, the loss carrying on — read from the run's JSON-lines log.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from rlalloc.env.telemetry_names import (
    TRAINER_CHECKPOINT_DURATION,
    TRAINER_LAST_CHECKPOINT_STEP,
    TRAINER_LAST_CHECKPOINT_TIME,
    TRAINER_LOSS,
    TRAINER_SAMPLES_PER_S,
    TRAINER_STEP,
    TRAINER_TOTAL_STEPS,
    TRAINER_WORLD_SIZE,
)
from rlalloc.trainer_jobs import layout
from rlalloc.trainer_jobs.launch import (
    final_timeline,
    free_port,
    start_torchrun,
    start_worker_pods,
    wait_for_event,
    worker_pids,
)
from rlalloc.trainer_jobs.runlog import read_events

TINY = ["--vocab-size", "64", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
        "--seq-len", "8", "--global-batch", "8", "--lr", "1e-2", "--num-samples", "4096"]
TIMEOUT_S = 90

pytestmark = pytest.mark.expensive


def _events(log: Path, name: str) -> list[dict]:
    return [e for e in read_events(log) if e["event"] == name]


def _assert_no_sample_twice_in_an_epoch(timeline: dict[int, dict]) -> None:
    steps = sorted(timeline)
    assert steps == list(range(1, len(steps) + 1)), "the step count has a gap or restarted"
    by_epoch: dict[int, list[int]] = {}
    for step in steps:
        by_epoch.setdefault(timeline[step]["epoch"], []).extend(timeline[step]["samples"])
    for samples in by_epoch.values():
        assert len(samples) == len(set(samples))


def _run_single(args: list[str], log: Path) -> subprocess.CompletedProcess:
    """The trainer without torchrun (a world of one), as `python -m rlalloc.trainer_jobs.train`."""
    return subprocess.run(
        [sys.executable, "-m", "rlalloc.trainer_jobs.train", "--log-jsonl", str(log), *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=TIMEOUT_S)


def test_killed_worker_restarts_from_checkpoint_and_sigterm_saves(tmp_path):
    log, ckpt, port = tmp_path / "run.jsonl", tmp_path / "ckpt", free_port()
    job = start_torchrun(2, [*TINY, "--max-steps", "100000", "--checkpoint-every-steps", "20",
                             "--checkpoint-dir", str(ckpt), "--metrics-port", str(port),
                             "--job-name", "lm-test"],
                         log, max_restarts=1, output_path=tmp_path / "torchrun.out")
    try:
        # kill once a periodic checkpoint has committed (async saves commit in the background,
        # later than the step that took them on a busy machine) and training went on past it
        saved = wait_for_event(log, lambda e: e["event"] == "checkpoint_committed"
                               and e["step"] >= 20 and e["step"] % 20 == 0, TIMEOUT_S, job)
        wait_for_event(log, lambda e: e["event"] == "step" and e["step"] >= saved["step"] + 10,
                       TIMEOUT_S, job)
        os.kill(worker_pids(log, restart=0)[1], signal.SIGKILL)
        resume = wait_for_event(log, lambda e: e["event"] == "resume", TIMEOUT_S, job)
        steps_before_kill = max(
            e["step"] for e in _events(log, "step") if e["time"] < resume["time"])
        periodic = [e["step"] for e in _events(log, "checkpoint_committed")
                    if e["time"] < resume["time"] and e["step"] % 20 == 0]
        # At most the steps since the latest periodic checkpoint are lost (the survivor's
        # emergency save usually keeps them all).
        assert max(periodic) <= resume["step"] <= steps_before_kill
        # past every step logged before the kill: those events are still in the log, and
        # stopping among them would leave replayed-later steps above the final stop; and past
        # a periodic checkpoint of the restarted job (one in 20 steps), or its checkpoint
        # duration gauge has no value yet to scrape
        wait_for_event(log, lambda e: e["event"] == "step" and e["time"] > resume["time"]
                       and e["step"] >= max(resume["step"] + 21, steps_before_kill + 1),
                       TIMEOUT_S, job)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        for name in (TRAINER_SAMPLES_PER_S, TRAINER_STEP, TRAINER_TOTAL_STEPS, TRAINER_WORLD_SIZE,
                     TRAINER_LOSS, TRAINER_LAST_CHECKPOINT_TIME, TRAINER_LAST_CHECKPOINT_STEP,
                     TRAINER_CHECKPOINT_DURATION):
            assert f'{name}{{job="lm-test",namespace="default",rank="0"}}' in scraped.decode()
        job.send_signal(signal.SIGTERM)  # what the kubelet does to the pod's torchrun
        job.wait(TIMEOUT_S)
    finally:
        job.kill()
    # the survivor ends with one line after its emergency save, not a traceback
    output = (tmp_path / "torchrun.out").read_text()
    failure = _events(log, "peer_failure")[0]
    assert f"trainer: peer failure at step {failure['step']}: saved checkpoint " in output
    assert "RuntimeError" not in output and not re.search(r"\[rank\d+\]: Traceback", output)
    stops = _events(log, "stop")
    assert len(stops) == 2 and stops[0]["step"] == stops[1]["step"]
    committed = _events(log, "checkpoint_committed")[-1]
    assert committed["step"] == stops[0]["step"]
    info, problems = layout.latest_valid(ckpt)
    assert info.step == stops[0]["step"] and not problems
    timeline = final_timeline(read_events(log))
    assert max(timeline) == stops[0]["step"]
    _assert_no_sample_twice_in_an_epoch(timeline)


def test_a_peer_killed_while_checkpointing_every_step_ends_the_survivor_in_one_line(tmp_path):
    # with a sync save after every step the kill lands mostly inside a save's collectives
    # (its agreement, DCP's plan exchange), which fail like the step's all-reduce does
    log, ckpt, output = tmp_path / "run.jsonl", tmp_path / "ckpt", tmp_path / "torchrun.out"
    job = start_torchrun(2, [*TINY, "--max-steps", "100000", "--checkpoint-every-steps", "1",
                             "--checkpoint-mode", "sync", "--checkpoint-dir", str(ckpt)],
                         log, output_path=output)
    try:
        wait_for_event(log, lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 5,
                       TIMEOUT_S, job)
        os.kill(worker_pids(log, restart=0)[1], signal.SIGKILL)
        assert job.wait(TIMEOUT_S) != 0
    finally:
        job.kill()
    text = output.read_text()
    failure = _events(log, "peer_failure")[0]
    assert failure["rank"] == 0, text
    assert f"trainer: peer failure at step {failure['step']}: saved checkpoint " in text, text
    assert "RuntimeError" not in text and not re.search(r"\[rank\d+\]: Traceback", text), text
    info, problems = layout.latest_valid(ckpt)
    assert info.step == failure["step"] and not problems  # the survivor's step is kept


def test_world_size_2_1_2_continues_the_loss_curve(tmp_path):
    log, ckpt = tmp_path / "run.jsonl", tmp_path / "ckpt"
    for nproc, max_steps in ((2, 20), (1, 40), (2, 60)):
        job = start_torchrun(nproc, [*TINY, "--max-steps", str(max_steps),
                                     "--checkpoint-every-steps", "10",
                                     "--checkpoint-dir", str(ckpt)], log)
        assert job.wait(TIMEOUT_S) == 0
    reference_log = tmp_path / "reference.jsonl"
    reference = _run_single([*TINY, "--max-steps", "60", "--checkpoint-every-steps", "0",
                             "--checkpoint-dir", str(tmp_path / "ref")], reference_log)
    assert reference.returncode == 0, reference.stderr
    resumes = _events(log, "resume")
    moves = [(r["saved_world_size"], r["world_size"], r["step"]) for r in resumes if r["rank"] == 0]
    assert moves == [(2, 1, 20), (1, 2, 40)]
    timeline = final_timeline(read_events(log))
    _assert_no_sample_twice_in_an_epoch(timeline)
    assert [timeline[s]["world_size"] for s in (20, 21, 41)] == [2, 1, 2]
    expected = final_timeline(read_events(reference_log))
    # Fixed global batch + loss scaled by world size: the resized run follows the same curve
    # as an uninterrupted one, and that curve has clearly left its starting point.
    for step in range(1, 61):
        assert timeline[step]["loss"] == pytest.approx(expected[step]["loss"], rel=2e-3)
        assert timeline[step]["samples"] == expected[step]["samples"]
    assert timeline[21]["loss"] < 0.9 * timeline[1]["loss"]
    assert timeline[60]["loss"] < timeline[21]["loss"]


def test_a_worker_of_two_processes_leaving_resumes_the_rest_at_the_same_step(tmp_path):
    # two worker pods of 2 processes each (nprocPerNode 2): two torchrun launchers on one
    # elastic rendezvous (1 to 2 workers). The second pod is deleted (SIGTERM to its torchrun,
    # as the kubelet does when a resize removes the last worker): all four ranks stop after
    # the same step and checkpoint it, and the remaining worker's torchrun restarts its two
    # processes, which resume from that checkpoint in a world of 2.
    log, ckpt = tmp_path / "run.jsonl", tmp_path / "ckpt"
    pods = start_worker_pods(
        2, 2, [*TINY, "--max-steps", "100000", "--checkpoint-every-steps", "20",
               "--checkpoint-dir", str(ckpt)],
        log, max_restarts=1, output_dir=tmp_path, min_workers=1,
        # quick to give up on the leaving worker and to close a round
        rdzv_conf="last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2")
    try:
        # the first round may hold one worker if the second joined late: its joining then
        # restarts the first, so wait for steps of the whole world of four
        first = wait_for_event(log, lambda e: e["event"] == "step" and e["world_size"] == 4,
                               TIMEOUT_S, pods[0])
        wait_for_event(log, lambda e: e["event"] == "step" and e["world_size"] == 4
                       and e["step"] >= first["step"] + 5, TIMEOUT_S, pods[0])
        pods[1].send_signal(signal.SIGTERM)
        pods[1].wait(TIMEOUT_S)
        resume = wait_for_event(log, lambda e: e["event"] == "resume" and e["rank"] == 0
                                and e["world_size"] == 2, TIMEOUT_S, pods[0])
        wait_for_event(log, lambda e: e["event"] == "step" and e["step"] >= resume["step"] + 5
                       and e["world_size"] == 2, TIMEOUT_S, pods[0])
        pods[0].send_signal(signal.SIGTERM)
        pods[0].wait(TIMEOUT_S)
    finally:
        for pod in pods:
            pod.kill()
    stops = [e for e in _events(log, "stop") if first["time"] < e["time"] < resume["time"]]
    assert len(stops) == 4 and {e["step"] for e in stops} == {resume["step"]}
    assert resume["saved_world_size"] == 4 and resume["path"].endswith(
        layout.step_dir_name(resume["step"]))
    # (world size, workers, rank, local rank) of each process started, before and after
    shapes = [{(e["world_size"], e["workers"], e["rank"], e["local_rank"])
               for e in _events(log, "start") if (e["time"] > stops[-1]["time"]) == after}
              for after in (False, True)]
    assert {(4, 2, rank, rank % 2) for rank in range(4)} <= shapes[0], shapes
    assert shapes[1] == {(2, 1, 0, 0), (2, 1, 1, 1)}, shapes
    timeline = final_timeline(read_events(log))
    _assert_no_sample_twice_in_an_epoch(timeline)
    assert timeline[resume["step"]]["world_size"] == 4
    assert timeline[resume["step"] + 1]["world_size"] == 2
    # the global batch and the data order do not depend on the world: an uninterrupted run of
    # one process draws the same samples and follows the same loss curve
    reference_log = tmp_path / "reference.jsonl"
    reference = _run_single([*TINY, "--max-steps", str(max(timeline)),
                             "--checkpoint-every-steps", "0",
                             "--checkpoint-dir", str(tmp_path / "ref")], reference_log)
    assert reference.returncode == 0, reference.stderr
    expected = final_timeline(read_events(reference_log))
    for step in range(1, max(timeline) + 1):
        assert timeline[step]["samples"] == expected[step]["samples"]
        assert timeline[step]["loss"] == pytest.approx(expected[step]["loss"], rel=2e-3)


def test_each_step_is_logged_with_the_epoch_its_batch_was_drawn_from(tmp_path):
    # 64 samples, batches of 8: steps 1-8 draw from epoch 0, 9-12 from epoch 1 (the position
    # after step 8 is already epoch 1, which labelled step 8's batch "epoch 1")
    from rlalloc.trainer_jobs.data import DataPosition, GlobalBatchSampler

    log = tmp_path / "run.jsonl"
    args = [*TINY[:-1], "64", "--max-steps", "12", "--checkpoint-dir", str(tmp_path / "ckpt")]
    assert TINY[-2] == "--num-samples"
    result = _run_single(args, log)
    assert result.returncode == 0, result.stderr
    sampler = GlobalBatchSampler(64, 8, 0)
    steps = _events(log, "step")
    assert [e["epoch"] for e in steps] == [0] * 8 + [1] * 4
    for event in steps:
        drawn_at = DataPosition(event["epoch"], 8 * ((event["step"] - 1) % 8))
        assert event["samples"] == sampler.global_batch_indices(drawn_at)
    _assert_no_sample_twice_in_an_epoch(final_timeline(read_events(log)))


def test_a_resumed_job_reports_its_restart_as_its_last_checkpoint_time(tmp_path):
    # the simulator counts a restart as a checkpoint (nothing trained before it is at risk):
    # exporting the loaded checkpoint's own time made a job suspended for hours look as if it
    # had trained for hours unsaved, to the actuator that weighs a move by it
    log, ckpt, port = tmp_path / "run.jsonl", tmp_path / "ckpt", free_port()
    first = _run_single([*TINY, "--max-steps", "5", "--checkpoint-dir", str(ckpt)], log)
    assert first.returncode == 0, first.stderr
    saved_unix = layout.latest_valid(ckpt)[0].created_unix
    job = subprocess.Popen(
        [sys.executable, "-m", "rlalloc.trainer_jobs.train", "--log-jsonl", str(log), *TINY,
         "--max-steps", "100000", "--checkpoint-every-steps", "0", "--checkpoint-dir", str(ckpt),
         "--metrics-port", str(port), "--job-name", "lm-test"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        resume = wait_for_event(log, lambda e: e["event"] == "resume", TIMEOUT_S, job)
        wait_for_event(log, lambda e: e["event"] == "step" and e["step"] > 5, TIMEOUT_S, job)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        job.kill()
        job.wait(TIMEOUT_S)
    labels = '{job="lm-test",namespace="default",rank="0"}'
    values = {line.split(" ")[0]: float(line.split(" ")[1])
              for line in scraped.decode().splitlines() if line.endswith(tuple("0123456789"))
              and labels in line}
    assert values[TRAINER_LAST_CHECKPOINT_STEP + labels] == 5.0
    assert values[TRAINER_LAST_CHECKPOINT_TIME + labels] >= resume["time"] > saved_unix


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    """The single `trainer: error` line of a refused start (exit code 2, no traceback)."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("trainer: error")]
    assert len(error_lines) == 1
    return error_lines[0]


@pytest.mark.parametrize(("blocker", "mode"), [
    ("step-000000010.tmp", "async"),  # rank 0 cannot create the checkpoint's .tmp directory
    ("step-000000010", "sync"),  # rank 0's commit (the rename) fails; the other ranks' part
    ("step-000000010", "async"),  # succeeded, and an async commit fails in the background
])
def test_a_checkpoint_rank_0_cannot_write_ends_every_rank_with_one_line(tmp_path, blocker, mode):
    log, ckpt, output = tmp_path / "run.jsonl", tmp_path / "ckpt", tmp_path / "torchrun.out"
    ckpt.mkdir()
    (ckpt / blocker).touch()  # a file where rank 0 alone needs a directory (root ignores modes)
    job = start_torchrun(2, [*TINY, "--max-steps", "20", "--checkpoint-every-steps", "5",
                             "--checkpoint-mode", mode, "--checkpoint-dir", str(ckpt)],
                         log, output_path=output)
    assert job.wait(TIMEOUT_S) != 0
    text = output.read_text()
    # each rank ends in main's UserError path (exit code 2) with the same line, printed once;
    # torchrun's summary cannot tell: it reports -15 for a worker it stopped after the first
    error_lines = [line for line in text.splitlines() if line.startswith("trainer: error")]
    assert len(error_lines) == 2 and len(set(error_lines)) == 1, text
    assert "could not write the checkpoint of step 10" in error_lines[0]
    assert "RuntimeError" not in text and not re.search(r"\[rank\d+\]: Traceback", text), text
    assert "peer failure" not in text and "terminate called" not in text, text
    root_cause = text[text.index("Root Cause"):]
    assert re.search(r"exitcode\s*: (-?\d+)", root_cause).group(1) == "2", text
    assert {e["rank"] for e in _events(log, "checkpoint_failed")} == {0, 1}
    assert not _events(log, "peer_failure")  # rank 0's failure is not a dead peer
    info, problems = layout.latest_valid(ckpt)
    assert info.step == 5 and not problems  # the last good checkpoint is kept
    assert not (ckpt / layout.tmp_dir_name(10)).is_dir()  # no half-written .tmp


@pytest.mark.parametrize("problem", ["checkpoint-dir", "metrics-port"])
def test_a_setup_error_of_rank_0_ends_every_rank_with_one_line(tmp_path, problem):
    log, output = tmp_path / "run.jsonl", tmp_path / "torchrun.out"
    (tmp_path / "a-file").touch()
    with socket.socket() as taken:  # rank 0 alone creates the directory and serves metrics
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        flags = {"checkpoint-dir": ["--checkpoint-dir", str(tmp_path / "a-file" / "ckpt")],
                 "metrics-port": ["--checkpoint-dir", str(tmp_path / "ckpt"),
                                  "--metrics-port", str(taken.getsockname()[1])]}[problem]
        job = start_torchrun(2, [*TINY, "--max-steps", "5", *flags], log, output_path=output)
        assert job.wait(TIMEOUT_S) != 0
    text = output.read_text()
    error_lines = [line for line in text.splitlines() if line.startswith("trainer: error")]
    assert len(error_lines) == 2 and len(set(error_lines)) == 1, text
    # the first rank to end did so through main's UserError path (exit code 2), not a crash
    root_cause = text[text.index("Root Cause"):]
    assert re.search(r"exitcode\s*: (-?\d+)", root_cause).group(1) == "2", text
    assert error_lines[0].startswith(f"trainer: error: --{problem} ")
    assert "RuntimeError" not in text and not re.search(r"\[rank\d+\]: Traceback", text), text
    assert "terminate called" not in text and not _events(log, "step"), text


def test_corrupt_checkpoint_falls_back_and_all_corrupt_is_one_line_error(tmp_path):
    log, ckpt = tmp_path / "run.jsonl", tmp_path / "ckpt"
    args = [*TINY, "--checkpoint-every-steps", "10", "--checkpoint-dir", str(ckpt)]
    assert _run_single([*args, "--max-steps", "20"], log).returncode == 0
    # another data order would make the saved position meaningless: refused, nothing touched
    refusal = _one_error_line(_run_single([*args, "--num-samples", "2048", "--max-steps", "25"],
                                          log))
    assert "--num-samples 4096 (flags: 2048)" in refusal
    newest = ckpt / layout.step_dir_name(20)
    shard = next(newest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated
    result = _run_single([*args, "--max-steps", "25"], log)
    assert result.returncode == 0, result.stderr
    skipped = [line for line in result.stdout.splitlines()
               if line.startswith("trainer: skipping bad checkpoint: ")]
    assert len(skipped) == 1 and skipped[0].startswith(
        f"trainer: skipping bad checkpoint: {newest}: {shard.name} has "), result.stdout
    assert skipped[0].endswith("(truncated?); moved to step-000000020.corrupt")
    resume = _events(log, "resume")[-1]
    assert resume["step"] == 10  # the previous good checkpoint, not the truncated one
    assert (ckpt / "step-000000020.corrupt").is_dir()
    assert max(final_timeline(read_events(log))) == 25

    for path in ckpt.glob("step-?????????"):
        for data in path.glob("*.distcp"):
            data.write_bytes(b"garbage")
    first = _one_error_line(_run_single([*args, "--max-steps", "30"], log))
    assert "no valid checkpoint" in first
    # a restart (pod OnFailure, torchrun --max-restarts) must not quietly start over
    assert _one_error_line(_run_single([*args, "--max-steps", "30"], log)) == first
    assert not layout.committed_dirs(ckpt)
