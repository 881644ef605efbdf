"""In-process checks of checkpointing in a world of one: reused staging buffers never leak into
a checkpoint that was already written, a save captures the state at the call, not the changes
the training loop makes once `before_update` has returned, and `restore` refuses what it must
(only quarantined checkpoints left, changed data settings) on every start, not just the first,
and a peer failure's emergency save does not trust a save of the same step that never committed,
nor writes another copy of one a sibling process of its worker committed while it waited."""

from __future__ import annotations

import errno
import os
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystem

from rlalloc.env.errors import UserError
from rlalloc.trainer_jobs import layout
from rlalloc.trainer_jobs.checkpoint import Checkpointer, Progress, TrainState, _machine_lock
from rlalloc.trainer_jobs.config import TrainConfig
from rlalloc.trainer_jobs.data import DataPosition
from rlalloc.trainer_jobs.model import ModelConfig
from rlalloc.trainer_jobs.runlog import RunLog, read_events
from rlalloc.trainer_jobs.staging import ReusingStager

CONFIG = TrainConfig(model=ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2,
                                       seq_len=8), num_samples=256)


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _checkpointer(root: Path, config: TrainConfig) -> Checkpointer:
    return Checkpointer(root, 0, 1, dist.group.WORLD, keep_last=3, config=config.to_json_dict(),
                        run_log=RunLog(None, 0), on_commit=lambda step, unix: None)


def _state(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return TrainState(model, optimizer, Progress(0, DataPosition(0, 0)))


def _train_step(state: TrainState) -> None:
    state.optimizer.zero_grad()
    state.model(torch.randn(16, 32)).square().mean().backward()
    state.optimizer.step()
    state.progress = Progress(state.progress.step + 1, DataPosition(0, state.progress.step + 1))


def _weights(state: TrainState) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.model.state_dict().items()}


def test_consecutive_async_saves_each_keep_their_own_step(world_of_one, tmp_path):
    state = _state(0)
    checkpointer = _checkpointer(tmp_path / "ckpt", CONFIG)
    saved = {}
    for _ in range(3):
        _train_step(state)
        saved[state.progress.step] = _weights(state)
        checkpointer.save(state, "async", "periodic")
        assert checkpointer.before_update() >= 0.0  # as the trainer does before its step
        with torch.no_grad():  # the loop goes on while the write runs in the background
            for param in state.model.parameters():
                param.add_(100.0)
    checkpointer.close()
    committed = layout.committed_dirs(tmp_path / "ckpt")
    assert [step for step, _ in committed] == [1, 2, 3]
    for step, path in committed:
        layout.verify(path)
        loaded = _state(1)
        dcp.load({"train": loaded}, checkpoint_id=path, process_group=dist.group.WORLD)
        assert loaded.progress.step == step
        for name, value in _weights(loaded).items():
            torch.testing.assert_close(value, saved[step][name], rtol=0, atol=0)


def _one_checkpoint(root: Path) -> None:
    """Train one step of the toy model and commit a synchronous checkpoint of it."""
    state = _state(0)
    checkpointer = _checkpointer(root, CONFIG)
    _train_step(state)
    checkpointer.save(state, "sync", "periodic")
    checkpointer.close()


def test_only_quarantined_checkpoints_refuse_every_restart(world_of_one, tmp_path):
    root = tmp_path / "ckpt"
    _one_checkpoint(root)
    for shard in root.glob("step-*/*.distcp"):
        shard.write_bytes(b"garbage")
    errors = []
    for _ in range(2):  # the first start quarantines it; a restart finds only the .corrupt
        with pytest.raises(UserError, match="no valid checkpoint") as refused:
            _checkpointer(root, CONFIG).restore(_state(1))
        errors.append(str(refused.value))
    assert errors[0] == errors[1] and "*.corrupt" in errors[0] and "\n" not in errors[0]
    assert [p.name for p in root.iterdir()] == ["step-000000001.corrupt"]  # nothing written


def test_restore_refuses_changed_data_settings_but_not_elastic_ones(world_of_one, tmp_path):
    root = tmp_path / "ckpt"
    _one_checkpoint(root)
    with pytest.raises(UserError, match=r"--seed 0 \(flags: 7\)"):
        _checkpointer(root, replace(CONFIG, seed=7)).restore(_state(1))
    elastic = replace(CONFIG, max_steps=5, parallelism="fsdp", checkpoint_every_steps=1,
                      metrics_port=9400, log_jsonl=tmp_path / "other.jsonl")
    resumed = _state(1)
    info = _checkpointer(root, elastic).restore(resumed)
    assert info.step == resumed.progress.step == 1


def test_emergency_save_writes_a_step_whose_earlier_save_never_committed(world_of_one, tmp_path):
    root = tmp_path / "ckpt"
    state = _state(0)
    checkpointer = _checkpointer(root, CONFIG)
    _train_step(state)
    checkpointer.save(state, "sync", "periodic")
    committed = root / layout.step_dir_name(1)
    assert checkpointer.emergency_save(state) == committed  # already there: nothing rewritten
    assert [p.name for p in root.iterdir()] == [committed.name]
    _train_step(state)
    checkpointer.save(state, "async", "periodic")  # as if the peer died before it committed:
    checkpointer.wait()
    (root / layout.step_dir_name(2)).rename(root / layout.tmp_dir_name(2))
    assert checkpointer.emergency_save(state) == root / layout.step_dir_name(2)
    checkpointer.close()
    info, problems = layout.latest_valid(root)
    assert info.step == 2 and not problems


def test_emergency_saves_of_one_machine_take_turns_and_keep_a_siblings_commit(world_of_one,
                                                                              tmp_path):
    # the k processes of a surviving worker each hold a full replica: while a sibling holds the
    # machine's lock this rank waits, and then finds the sibling's commit instead of writing
    # another copy of the whole state
    root, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    state = _state(0)
    checkpointer = Checkpointer(root, 0, 1, dist.group.WORLD, keep_last=3,
                                config=CONFIG.to_json_dict(), run_log=RunLog(log, 0),
                                on_commit=lambda step, unix: None)
    _train_step(state)
    saved: list[Path] = []
    with _machine_lock(root):  # the sibling saving
        waiting = threading.Thread(target=lambda: saved.append(checkpointer.emergency_save(state)))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and not root.exists()
        checkpointer.save(state, "sync", "periodic")  # stands in for the sibling's commit
    waiting.join(30)
    checkpointer.close()
    assert saved == [root / layout.step_dir_name(1)]
    assert [p.name for p in root.iterdir()] == [layout.step_dir_name(1)]
    assert [e["reason"] for e in read_events(log) if e["event"] == "checkpoint"] == ["periodic"]


@pytest.mark.parametrize("mode", ["sync", "async", "emergency"])
def test_a_save_the_volume_cannot_hold_is_one_line_and_keeps_the_last_checkpoint(
        world_of_one, tmp_path, monkeypatch, mode):
    root = tmp_path / "ckpt"
    state = _state(0)
    checkpointer = _checkpointer(root, CONFIG)
    _train_step(state)
    checkpointer.save(state, "sync", "periodic")
    _train_step(state)

    @contextmanager
    def full_disk(self, path, open_mode):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        yield

    monkeypatch.setattr(FileSystem, "create_stream", full_disk)
    with pytest.raises(UserError) as refused:
        if mode == "emergency":
            checkpointer.emergency_save(state)
        else:
            checkpointer.save(state, mode, "periodic")
            checkpointer.close()  # an async save's failure comes out at the next wait
    message = str(refused.value)
    assert "\n" not in message and f"--checkpoint-dir {root}" in message
    assert "step 2" in message and "No space left on device" in message
    assert [p.name for p in root.iterdir()] == [layout.step_dir_name(1)]  # no half-written .tmp
    info, problems = layout.latest_valid(root)
    assert info.step == 1 and not problems


def test_stager_reuses_its_buffers_and_leaves_tensor_subclasses_to_dcp():
    stager = ReusingStager()
    live = {"w": torch.arange(6.0), "groups": [{"lr": 0.1, "params": ["w"]}]}
    first = stager.stage(live).result()
    live["w"].add_(1.0)
    assert first["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # a copy, not a view
    second = stager.stage(live).result()
    assert second["w"].data_ptr() == first["w"].data_ptr()  # same buffer, no new allocation
    assert second["groups"] == live["groups"] and second["groups"] is not live["groups"]
    subclass = {"p": nn.Parameter(torch.ones(3))}
    staged = stager.stage(subclass).result()
    with torch.no_grad():
        subclass["p"].mul_(5.0)
    assert torch.equal(staged["p"], torch.ones(3))
    stager.close()


def test_checkpoints_rank_0_cannot_read_are_one_line_not_a_traceback(world_of_one, tmp_path,
                                                                     monkeypatch):
    root = tmp_path / "ckpt"
    _one_checkpoint(root)

    def unreadable(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(layout, "_crc32", unreadable)
    # rank 0 picks alone: its error goes out in the broadcast every rank waits in
    with pytest.raises(UserError, match="Permission denied") as refused:
        _checkpointer(root, CONFIG).restore(_state(1))
    assert "\n" not in str(refused.value) and f"--checkpoint-dir {root}" in str(refused.value)
    assert [p.name for p in root.iterdir()] == [layout.step_dir_name(1)]  # nothing quarantined
