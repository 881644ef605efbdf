"""The agent commands (train, evaluate, headroom) refuse bad input before any work, and never
mix one run's files with another's: --force replaces a whole run, a refused run leaves the
earlier one exactly as it was."""

from __future__ import annotations

import json
import math
import shutil
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from rlalloc.agent import callbacks, training
from rlalloc.agent.checkpoints import checkpoint_timesteps
from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.registry import load_policy
from rlalloc.agent.sb3_models import DQN_LEARNING_STARTS
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.train_evaluation import evaluate_jct, give_up_bounds
from rlalloc.agent.training import train
from rlalloc.cli.main import main
from rlalloc.env.cluster import parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.scenario import build_scenario
from rlalloc.env.simulator import GiveUp

torch.set_num_threads(1)
TINY = ("synthetic:12:1.5",)
CONFIG = TrainConfig(workloads=TINY, cluster="2x4", timesteps=128, n_envs=1, n_steps=128,
                     batch_size=64, warm_start="elastic", dagger_rounds=0, bc_epochs=2,
                     eval_every=128, net_arch=(32,), give_up_factor=0.0)
"""A tiny run for the plumbing: its policy (2 epochs of cloning) is ~8x worse than static, so
evaluations are never given up (`give_up_factor` 0), or it would export nothing."""
TRAIN = ["train", "--workload", TINY[0], "--cluster", "2x4", "--n-envs", "1", "--n-steps",
         "128", "--batch-size", "64", "--dagger-rounds", "0", "--timesteps", "128"]
"""A tiny `rlalloc train` command line; a bad flag added after it overrides its value."""
CLUSTER_YAML = ("nodes:\n  - {count: 1, gpus: 4}\n"
                "  - {count: 1, gpus: 4, gpu_type: t4, rack: 3}\n")
"""A cluster file whose content a card must keep: the shape `2x4` alone has no rack. (One GPU
type: the tiny cloned policy would strand jobs in the larger typed action space of a mixed
cluster, and nothing would be exported.)"""
EVALUATE = ["evaluate", "--workload", "synthetic:8:1.0", "--cluster", "2x4", "--seeds", "1",
            "--jobs", "1", "--failures", "none"]


def quiet(_: str) -> None:
    """A `train` log that prints nothing."""


def files(directory) -> dict[str, bytes]:
    """Every file under `directory` (relative path -> bytes)."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def run_cli(argv: list[str], capsys) -> tuple[int, str, float]:
    """Exit code, the one stderr line and wall seconds of `rlalloc ARGV` run in this process
    (flag errors included: `rlalloc.cli.main` turns argparse's into one line too)."""
    started = time.perf_counter()
    code = main(argv)
    elapsed = time.perf_counter() - started
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return code, lines[-1], elapsed


def test_force_starts_a_clean_run_that_resume_then_continues(tmp_path):
    """The replaced run's checkpoints and TensorBoard logs go: a resume continues the new run,
    from its own last step; each step is evaluated once."""
    out = tmp_path / "model"
    train(replace(CONFIG, timesteps=256), out, log=quiet)
    forced = train(CONFIG, out, force=True, log=quiet)
    assert [e["timesteps"] for e in forced["evaluations"]] == [0, 128]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "last.zip", "step_128_steps.zip"]
    assert [p.name for p in (out / "tb").iterdir()] == ["ppo_1"]
    resumed = train(replace(CONFIG, timesteps=384), out, resume=True, log=quiet)
    assert resumed["timesteps"] == 384
    assert [e["timesteps"] for e in resumed["evaluations"]] == [0, 128, 256, 384]


def test_keep_checkpoints_keeps_the_newest_and_resume_goes_on_from_them(tmp_path):
    config = replace(CONFIG, timesteps=512, keep_checkpoints=2)
    train(config, tmp_path, log=quiet)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "last.zip", "step_384_steps.zip", "step_512_steps.zip"]
    resumed = train(replace(config, timesteps=640), tmp_path, resume=True, log=quiet)
    assert resumed["timesteps"] == 640
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "last.zip", "step_512_steps.zip", "step_640_steps.zip"]


@pytest.mark.parametrize("change, named", [({"cluster": "1x4"}, "--cluster 2x4"),
                                           ({"workloads": ("synthetic:6:1.0",)},
                                            "--workload synthetic:12:1.5")])
def test_a_resume_on_another_setting_is_refused_naming_the_run_s(tmp_path, change, named):
    """Flags left out of a resume took their defaults: the run went on on another workload
    and cluster, and its card compared evaluations of both."""
    train(CONFIG, tmp_path, log=quiet)
    before = files(tmp_path)
    with pytest.raises(UserError, match=f"was trained with {named}; give the same"):
        train(replace(CONFIG, timesteps=256, **change), tmp_path, resume=True, log=quiet)
    assert files(tmp_path) == before


def test_a_resumed_run_keeps_the_commands_it_continues(tmp_path):
    """A resume rewrites train_config.json and the card with its own command line (it may
    change --timesteps); the commands before it stay on record."""
    commands = ["rlalloc train (first)", "rlalloc train --resume (second)",
                "rlalloc train --resume (third)"]
    train(replace(CONFIG, extra={"command": commands[0]}), tmp_path, log=quiet)
    for steps, command in zip((256, 384), commands[1:], strict=True):
        train(replace(CONFIG, timesteps=steps, extra={"command": command}), tmp_path,
              resume=True, log=quiet)
    saved = json.loads((tmp_path / "train_config.json").read_text())["extra"]
    assert saved == {"command": commands[2], "earlier_commands": commands[:2]}
    card = (tmp_path / "card.md").read_text()
    assert card.index(commands[2]) < card.index(commands[1]) < card.index(commands[0])


@pytest.mark.parametrize("earlier", ["checkpoints/last.zip", "card.json", "card.md",
                                     "train_config.json", "tb/ppo_1/events"])
def test_a_new_run_refuses_every_file_of_an_earlier_one(tmp_path, earlier):
    (tmp_path / earlier).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / earlier).write_text("earlier run")
    with pytest.raises(UserError, match="--force"):
        train(CONFIG, tmp_path, log=quiet)
    assert files(tmp_path) == {earlier: b"earlier run"}


def test_a_run_whose_evaluations_never_finish_exports_nothing_and_says_so(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(callbacks, "evaluate_jct", lambda *args, **kwargs: float("inf"))
    logged: list[str] = []
    with pytest.raises(UserError, match="no evaluation finished every job"):
        train(CONFIG, tmp_path, log=logged.append)
    assert "step 0: avg JCT unfinished on 1 evaluation workload(s) (best unfinished)" in logged
    assert not (tmp_path / "policy.json").exists()
    card = json.loads((tmp_path / "card.json").read_text(),
                      parse_constant=lambda name: pytest.fail(f"card.json holds {name}"))
    assert card["exported_timesteps"] is None and card["best_avg_jct_s"] is None
    assert all(e["avg_jct_s"] is None for e in card["evaluations"])
    assert "| 0 | unfinished |" in (tmp_path / "card.md").read_text()
    assert (tmp_path / "checkpoints" / "last.zip").is_file()


def test_a_run_without_rl_steps_saves_its_checkpoint_without_a_warning(tmp_path):
    """No RL step, so no periodic checkpoint made checkpoints/ before the last one is saved:
    SB3 would warn that it creates the directory."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(replace(CONFIG, timesteps=0), tmp_path, log=quiet)
    assert (tmp_path / "checkpoints" / "last.zip").is_file()
    assert not [w for w in caught if "does not exist" in str(w.message)]


def test_resume_before_the_first_checkpoint_says_to_start_again_with_force(tmp_path):
    (tmp_path / "train_config.json").write_text("{}")  # all a run interrupted early leaves
    with pytest.raises(UserError, match="nothing to resume .* start it again with --force"):
        train(CONFIG, tmp_path, resume=True, log=quiet)


@pytest.mark.parametrize("made", [False, True])
def test_resume_where_there_is_no_run_says_to_leave_out_resume(tmp_path, capsys, made):
    """Nothing is there to replace, so --force would be the wrong advice; the refusal leaves
    no directory behind."""
    out = tmp_path / "model"
    if made:
        out.mkdir()
    code, error, _ = run_cli([*TRAIN, "--resume", "--out", str(out)], capsys)
    assert code == 2 and "there is no run in" in error, error
    assert "leave out --resume to start one" in error and "--force" not in error, error
    assert out.exists() == made and (not made or not any(out.iterdir()))


def assert_cluster_recorded(recorded: dict, path, cluster, tmp_path) -> None:
    """`recorded` (a card's ``cluster_file``) names `path` and, saved as YAML once the file
    is gone, gives `cluster` back."""
    assert recorded["path"] == str(path) and recorded["shape"] == "2x4"
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(recorded["content"]))
    assert parse_cluster(str(again)) == cluster


def test_a_model_card_records_a_cluster_file_as_it_was_used(tmp_path, trained):
    """A run on a YAML cluster can be re-run once the file has moved: card.json keeps its
    content, card.md shows it; a NODESxGPUS spec is its own record."""
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER_YAML)
    cluster = parse_cluster(str(path))
    out = tmp_path / "model"
    train(replace(CONFIG, cluster=str(path), timesteps=0), out, log=quiet)
    path.unlink()
    card = json.loads((out / "card.json").read_text())
    assert card["config"]["cluster"] == str(path)
    assert_cluster_recorded(card["cluster_file"], path, cluster, tmp_path)
    markdown = (out / "card.md").read_text()
    assert f"- cluster: {path} (2x4," in markdown and "  rack: 3\n" in markdown
    assert json.loads((trained / "card.json").read_text())["cluster_file"] is None
    assert "```yaml" not in (trained / "card.md").read_text()


@pytest.mark.parametrize("checkpointed", [True, False])
def test_an_interrupted_train_says_resume_continues_it_if_it_checkpointed(
        tmp_path, capsys, monkeypatch, checkpointed):
    out = tmp_path / "model"

    def interrupted(config, out, **kwargs):
        if checkpointed:
            (out / "checkpoints").mkdir(parents=True)
            (out / "checkpoints" / "step_128_steps.zip").write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    code, error, _ = run_cli([*TRAIN, "--out", str(out)], capsys)
    assert code == 130 and error.startswith("rlalloc: interrupted")
    assert ("--resume continues it from" in error) == checkpointed, error


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model directory from a run without RL steps."""
    out = tmp_path_factory.mktemp("trained") / "model"
    train(replace(CONFIG, timesteps=0), out, log=quiet)
    return out


@pytest.mark.parametrize("change, named", [({"cluster": "0x4"}, "--cluster 2x4"),
                                           ({"eval_workloads": ("/no/such.csv",)},
                                            r"--eval-workload \(none\)"),
                                           ({"algo": "dqn"}, "--algo ppo"),
                                           # SB3 restores these from the checkpoint: the
                                           # config recorded others than it trained with
                                           ({"learning_rate": 1e-3}, "--learning-rate 0.0001"),
                                           ({"n_steps": 64}, "--n-steps 128"),
                                           ({"time_discount_s": 3600.0},
                                            "--time-discount-s 1800.0")])
def test_a_refused_resume_leaves_the_run_as_it_was(trained, change, named):
    before = files(trained)
    with pytest.raises(UserError, match=named):
        train(replace(CONFIG, timesteps=256, **change), trained, resume=True, log=quiet)
    assert files(trained) == before


@pytest.mark.parametrize("name, content", [("train_config.json", "{"),
                                           ("train_config.json", "[1]"),
                                           ("card.json", "{"),
                                           ("policy.json", "{")])
def test_a_resume_of_a_run_with_a_damaged_file_is_refused_before_it_trains(
        tmp_path, name, content):
    """A traceback before (config, card), or a one-line error only after every resumed step,
    which then left nothing to resume ("already at N steps") and no way to export (policy)."""
    train(replace(CONFIG, timesteps=256), tmp_path, log=quiet)
    (tmp_path / name).write_text(content)
    before = files(tmp_path)
    with pytest.raises(UserError, match=f"{name}.*(damaged|does not load)"):
        train(replace(CONFIG, timesteps=384), tmp_path, resume=True, log=quiet)
    assert files(tmp_path) == before


@pytest.mark.parametrize("factor", [-1.0, 0.5, math.inf, math.nan])
def test_a_give_up_factor_that_gives_up_every_run_or_none_by_accident_is_refused(tmp_path,
                                                                                  factor):
    with pytest.raises(UserError, match="give_up_factor"):
        train(replace(CONFIG, give_up_factor=factor), tmp_path / "model", log=quiet)
    assert not (tmp_path / "model").exists()


def test_a_resume_of_a_run_whose_config_has_a_list_damaged_is_one_line(tmp_path, capsys):
    out = tmp_path / "model"
    train(CONFIG, out, log=quiet)
    saved = json.loads((out / "train_config.json").read_text())
    (out / "train_config.json").write_text(json.dumps({**saved, "net_arch": None}))
    code, error, _ = run_cli([*TRAIN, "--timesteps", "256", "--resume", "--out", str(out)],
                             capsys)
    assert code == 2 and "train_config.json: damaged" in error


def test_the_command_resumes_a_run_whose_settings_it_has_no_flag_for(tmp_path, capsys):
    """CONFIG's net_arch (32,) and bc_epochs 2 have no flag: taken at today's defaults, they
    made every command-line resume of the run a refusal naming flags that do not exist."""
    out = tmp_path / "model"
    train(CONFIG, out, log=quiet)
    assert main([*TRAIN, "--timesteps", "256", "--resume", "--out", str(out)]) == 0
    saved = json.loads((out / "train_config.json").read_text())
    assert (saved["net_arch"], saved["bc_epochs"], saved["timesteps"]) == ([32], 2, 256)
    capsys.readouterr()


def test_a_resume_that_adds_no_steps_is_refused_and_leaves_the_run_as_it_was(tmp_path):
    """--timesteps is the total to reach: at or below the checkpoint's steps a resume would
    train nothing yet rewrite the card and config with the smaller number."""
    out = tmp_path / "model"
    train(CONFIG, out, log=quiet)
    before = files(out)
    for timesteps in (CONFIG.timesteps, 64):
        with pytest.raises(UserError, match="already at 128 steps.* give a larger --timesteps"):
            train(replace(CONFIG, timesteps=timesteps), out, resume=True, log=quiet)
    assert files(out) == before


def test_a_run_stopped_after_its_last_steps_still_resumes_to_its_end(tmp_path):
    """Killed between its last RL step and the end (final evaluation, card totals), a run has
    all its steps but no finished card: resuming it with the same --timesteps completes it."""
    out = tmp_path / "model"
    train(CONFIG, out, log=quiet)
    card = json.loads((out / "card.json").read_text())
    for total in ("timesteps", "wall_s", "best_avg_jct_s", "exported_timesteps"):
        card.pop(total)  # as the card written at each evaluation, before the end
    (out / "card.json").write_text(json.dumps(card))
    train(CONFIG, out, resume=True, log=quiet)
    assert json.loads((out / "card.json").read_text())["timesteps"] == CONFIG.timesteps


@pytest.mark.parametrize("argv", [["simulate"], [*TRAIN], [*EVALUATE], ["sizes", "fit"],
                                  ["forecast", "train", "--series", "a.csv"],
                                  ["forecast", "evaluate", "--series", "a.csv"]])
def test_an_empty_out_is_refused_not_taken_as_the_current_directory(tmp_path, capsys,
                                                                    monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    code, error, _ = run_cli([*argv, "--out", ""], capsys)
    assert code == 2 and "--out" in error and "is empty" in error, error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, named", [
    ([*TRAIN, "--eval-every", "0"], "--eval-every"),
    ([*TRAIN, "--eval-every", "-5"], "--eval-every"),
    ([*TRAIN, "--timesteps", "-5"], "--timesteps"),
    ([*TRAIN, "--batch-size", "0"], "--batch-size"),
    ([*TRAIN, "--n-steps", "0"], "--n-steps"),
    ([*TRAIN, "--n-steps", "1"], "--n-steps 1 x --n-envs 1"),
    ([*TRAIN, "--n-envs", "0"], "--n-envs"),
    ([*TRAIN, "--gamma", "2"], "--gamma"),
    ([*TRAIN, "--learning-rate", "-1"], "--learning-rate"),
    ([*TRAIN, "--seed", "-1"], "--seed"),
    ([*TRAIN, "--eval-workload", "/no/such.csv"], "/no/such.csv"),
    ([*TRAIN, "--cluster", "0x4"], "0x4"),
    ([*TRAIN, "--warm-start", "nope"], "nope"),
    ([*TRAIN, "--residual", "elastic", "--residual-veto-p", "0"], "--residual-veto-p"),
    ([*TRAIN, "--batch-size", "256"], "--batch-size 256 is more than a rollout's"),
    ([*TRAIN, "--residual", "elastic,elastic-srpt,elastic"], "elastic is given twice"),
    ([*EVALUATE, "--jobs", "0"], "--jobs"),
    ([*EVALUATE, "--jobs", "-2"], "--jobs"),
    ([*EVALUATE, "--seeds", "0"], "--seeds"),
    ([*EVALUATE, "--policies", "static,static"], "static twice"),
    ([*EVALUATE, "--workload", "synthetic:8:1.0"], "--workload: synthetic:8:1.0 is given twice"),
    (["headroom", "--workload", "a.csv", "--workload", "b.csv", "--workload", "a.csv"],
     "--workload: a.csv is given twice"),
    (["headroom", "--seed", "-1"], "--seed"),
    (["headroom", "--jobs", "0"], "--jobs"),
    (["headroom", "--futures", "none,none"], "none twice"),
    (["headroom", "--futures", "sampled-1h", "--history", "a.csv", "--history", "a.csv"],
     "--history: a.csv is given twice"),
    (["sizes", "fit", "--workload", "a.csv", "--workload", "a.csv"],
     "--workload: a.csv is given twice"),
    (["forecast", "train", "--series", "a.csv", "a.csv"], "--series a.csv is given twice"),
    # a run labelled adaptive on jobs without an application was the plain run
    ([*EVALUATE, "--policies", "static,elastic@adaptive"],
     "--efficiency adaptive: no job of synthetic:8:1.0 names an application"),
    (["simulate", "--workload", "synthetic:8", "--efficiency", "fixed"],
     "--efficiency fixed: no job of synthetic:8 names an application"),
    ([*TRAIN, "--efficiency", "adaptive"], "--efficiency adaptive: no job of"),
    (["headroom", "--workload", "synthetic:8", "--efficiency", "adaptive"],
     "--efficiency adaptive: no job of synthetic:8 names an application"),
    # a --record with no lookahead recorded nothing, and with --force wiped earlier recordings
    (["headroom", "--workload", "synthetic:8", "--futures", "", "--sizes", "known", "--record"],
     "--record records the lookahead's decisions"),
    # as `sizes fit` refuses it: learned from jobs without applications, the table is empty
    (["headroom", "--workload", "synthetic:8", "--futures", "", "--sizes", "learned",
      "--history", "synthetic:20:2:2"], "no job names its application"),
])
def test_bad_flags_are_one_line_errors_before_any_work(tmp_path, capsys, argv, named):
    out = tmp_path / "out"
    code, error, elapsed = run_cli([*argv, "--out", str(out)], capsys)
    assert code == 2 and "error:" in error and named in error, error
    assert elapsed < 8.0  # checked, not trained or simulated (that takes longer)
    assert not out.exists()  # a refused run leaves no directory behind


def test_evaluate_force_leaves_no_output_of_the_replaced_run(tmp_path, capsys):
    """A re-run with one policy has no paired plot: the replaced run's must not pass for its;
    with one run per policy the CIs read n/a, and no change against static is announced."""
    assert main([*EVALUATE, "--policies", "static,elastic", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "paired_avg_jct.png").is_file()
    assert main([*EVALUATE, "--policies", "elastic", "--out", str(tmp_path), "--force"]) == 0
    assert not (tmp_path / "paired_avg_jct.png").exists()
    results = (tmp_path / "results.md").read_text()
    assert "± n/a" in results and "± 0 " not in results and "in brackets" not in results
    capsys.readouterr()


def test_evaluate_stopped_by_ctrl_c_leaves_no_new_directory(tmp_path, monkeypatch, capsys):
    def stopped(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr("rlalloc.cli.evaluate.run_one", stopped)
    out = tmp_path / "new" / "eval"
    assert main([*EVALUATE, "--policies", "static", "--out", str(out)]) == 130
    assert "rlalloc: interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("directory", ["ppo", "mine"])
def test_evaluate_labels_a_saved_model_named_like_a_built_in_by_its_path(
        trained, tmp_path, capsys, directory):
    """``runs/ppo`` is not the shipped ppo: labelled `ppo`, its row would pass for it."""
    model = tmp_path / directory
    shutil.copytree(trained, model)
    out = tmp_path / "out"
    assert main([*EVALUATE, "--policies", f"elastic,{model}", "--out", str(out)]) == 0
    label = str(model) if directory == "ppo" else directory
    report = json.loads((out / "results.json").read_text())
    assert list(report["policies"]) == ["elastic", label]
    assert report["sources"] == {"elastic": "elastic", label: str(model)}
    assert f"| {label} |" in (out / "results.md").read_text()
    # the label results.md shows is a name --reference takes, as is the path
    assert main([*EVALUATE, "--policies", f"elastic,{model}", "--reference", label,
                 "--out", str(out), "--force"]) == 0
    assert json.loads((out / "results.json").read_text())["paired"]["reference"] == label
    capsys.readouterr()


def test_evaluate_records_a_cluster_file_as_it_was_used(tmp_path, capsys):
    """results.json's ``cluster`` stays --cluster as given (a string); ``cluster_file`` keeps
    a YAML file's content, and results.md shows it."""
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER_YAML)
    cluster = parse_cluster(str(path))
    out = tmp_path / "out"
    assert main([*EVALUATE, "--cluster", str(path), "--policies", "static",
                 "--out", str(out)]) == 0
    path.unlink()
    report = json.loads((out / "results.json").read_text())
    assert report["cluster"] == str(path)
    assert_cluster_recorded(report["cluster_file"], path, cluster, tmp_path)
    assert "  rack: 3\n" in (out / "results.md").read_text()
    assert main([*EVALUATE, "--policies", "static", "--out", str(out), "--force"]) == 0
    report = json.loads((out / "results.json").read_text())
    assert report["cluster"] == "2x4" and report["cluster_file"] is None
    capsys.readouterr()


def tensorboard_steps(out, tag: str) -> list[int]:
    """The steps of scalar `tag` in a run's TensorBoard logs, as TensorBoard shows them
    (after purges)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = (out / "tb").iterdir()
    events = EventAccumulator(str(folder))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def stop_after_checkpoint(out, step: int, evaluated: bool) -> None:
    """Make `out` look like a run killed after saving its checkpoint at `step`, before or
    after (`evaluated`) evaluating it: no later checkpoint or evaluation, no card totals."""
    for checkpoint in (out / "checkpoints").glob("*.zip"):
        if checkpoint.name == "last.zip" or checkpoint_timesteps(checkpoint) > step:
            checkpoint.unlink()
    card = json.loads((out / "card.json").read_text())
    card["evaluations"] = [e for e in card["evaluations"]
                           if e["timesteps"] < step or (evaluated and e["timesteps"] == step)]
    for total in ("timesteps", "wall_s", "best_avg_jct_s", "exported_timesteps"):
        card.pop(total)
    (out / "card.json").write_text(json.dumps(card))


def killed_while_writing(target) -> None:
    """Write the start of a zip to `target` (a path or a file object) and stop, as a run
    killed while saving would."""
    if isinstance(target, (str, Path)):
        target = Path(target).open("wb")  # left open, as by a kill
    target.write(b"PK\x03\x04 truncated")
    raise KeyboardInterrupt


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_every_evaluation_is_in_tensorboard_at_its_own_step(tmp_path, monkeypatch, algo):
    """SB3 dumps its logger at rollout (PPO) or episode (DQN) ends: recorded there, the
    evaluations at step 0 and at the end never reached TensorBoard, and DQN's at a later
    step, or not at all when a later one replaced it before the dump."""
    monkeypatch.setattr(callbacks, "evaluate_jct", lambda *args, **kwargs: 1000.0)
    summary = train(replace(CONFIG, algo=algo, timesteps=256, eval_every=64), tmp_path,
                    log=quiet)
    assert tensorboard_steps(tmp_path, "eval/avg_jct_s") == [
        e["timesteps"] for e in summary["evaluations"]] == [0, 64, 128, 192, 256]


def test_a_resumed_run_continues_its_moved_tensorboard_curves_without_overlap(tmp_path):
    """The resumed steps after the checkpoint replace the stopped run's in TensorBoard, and
    the events go to the run's directory where it is now, not where it was trained."""
    trained_in, out = tmp_path / "first", tmp_path / "moved"
    train(replace(CONFIG, timesteps=256), trained_in, log=quiet)
    shutil.move(trained_in, out)
    stop_after_checkpoint(out, 128, evaluated=True)
    train(replace(CONFIG, timesteps=256), out, resume=True, log=quiet)
    assert not trained_in.exists()
    assert tensorboard_steps(out, "time/fps") == [128, 256]
    assert tensorboard_steps(out, "eval/avg_jct_s") == [0, 128, 256]


def test_a_run_killed_between_a_checkpoint_and_its_evaluation_resumes_evaluating_it(
        tmp_path):
    """Checkpoints are saved before the evaluation at the same step, so a card's evaluations
    all have a checkpoint; one not yet evaluated is evaluated when the run resumes."""
    train(replace(CONFIG, timesteps=256), tmp_path, log=quiet)
    stop_after_checkpoint(tmp_path, 256, evaluated=False)
    resumed = train(replace(CONFIG, timesteps=384), tmp_path, resume=True, log=quiet)
    assert [e["timesteps"] for e in resumed["evaluations"]] == [0, 128, 256, 384]


def test_a_resume_from_an_earlier_checkpoint_evaluates_the_steps_it_trains_again(tmp_path):
    """Resumed from 256 (its newer checkpoints gone: killed before saving them, or deleted to
    go back), the run trains 257-384 again: the card's 384 was another policy's. It stays,
    marked discarded (the export may be it), and the new policy at 384 is evaluated too."""
    train(replace(CONFIG, timesteps=384), tmp_path, log=quiet)
    for name in ("last.zip", "step_384_steps.zip"):
        (tmp_path / "checkpoints" / name).unlink()
    resumed = train(replace(CONFIG, timesteps=384), tmp_path, resume=True, log=quiet)
    assert [(e["timesteps"], e.get("discarded", False)) for e in resumed["evaluations"]] == [
        (0, False), (128, False), (256, False), (384, True), (384, False)]
    card = (tmp_path / "card.md").read_text()
    assert "| 384 (discarded) |" in card and "trained those steps again" in card
    assert tensorboard_steps(tmp_path, "eval/avg_jct_s") == [0, 128, 256, 384]


def test_a_resumed_dqn_refills_its_replay_buffer_before_it_learns(tmp_path, monkeypatch):
    """The checkpoint holds no replay buffer: resumed past learning_starts, DQN took gradient
    steps on batches of 64 drawn from its first 4, 8, 12... transitions."""
    from rlalloc.agent.dqn import dqn_class

    dqn = dqn_class()

    def train_to(timesteps: int, resume: bool) -> None:
        try:  # so few steps may export nothing: what is checked is how it learns
            train(replace(config, timesteps=timesteps), tmp_path, resume=resume, log=quiet)
        except UserError as err:
            assert "no policy was exported" in str(err)

    # residual and held near elastic by the margin loss, whose evaluations take seconds (a
    # 2-epoch clone, greedy over valid actions, restarts jobs at every decision until it is
    # given up)
    config = replace(CONFIG, algo="dqn", residual=("elastic",), dqn_demo_weight=1.0,
                     eval_every=1100, n_envs=1, give_up_factor=3.0)
    train_to(1100, resume=False)
    sizes: list[int] = []
    learn = dqn.train
    monkeypatch.setattr(dqn, "train", lambda model, *args, **kwargs: (
        sizes.append(model.replay_buffer.size()), learn(model, *args, **kwargs))[1])
    train_to(2300, resume=True)
    assert sizes and min(sizes) >= DQN_LEARNING_STARTS


def test_an_evaluation_far_worse_than_static_is_given_up_early():
    """A random start leaves jobs waiting: each periodic evaluation ran to the time limit (over
    15 minutes on one Pollux workload) to score "unfinished"; it now stops once its average
    JCT is sure to exceed give_up_factor x static's (or a job waited that many times static's
    longest JCT), and scores the same."""
    from rlalloc.env.state import NOOP

    config = replace(CONFIG, give_up_factor=TrainConfig().give_up_factor)
    static = run_policy(build_scenario(TINY[0], config.cluster).simulator(config.sim_params()),
                        load_policy("static").act)
    bounds = give_up_bounds(config, TINY)
    assert bounds[TINY[0]] == GiveUp(
        pytest.approx(3.0 * static.metrics["avg_jct_s"]), pytest.approx(3.0 * max(static.jcts_s)),
        30 * static.decisions)
    assert give_up_bounds(CONFIG, TINY)[TINY[0]] == GiveUp()  # factor 0: never
    decisions = {"bounded": 0, "unbounded": 0}
    for name, give_up in (("bounded", bounds), ("unbounded", None)):

        def idle(state: object, counted: str = name) -> object:
            decisions[counted] += 1
            return NOOP

        assert evaluate_jct(idle, config, TINY, give_up=give_up) == math.inf
    assert 0 < 5 * decisions["bounded"] < decisions["unbounded"]


def test_a_run_killed_while_saving_a_checkpoint_leaves_no_truncated_one(tmp_path,
                                                                        monkeypatch):
    """SB3 writes its zip in place: killed mid-write, a run left a truncated checkpoint that
    --resume picked as the newest and failed on with a traceback."""
    from stable_baselines3.common import base_class

    monkeypatch.setattr(base_class, "save_to_zip_file",
                        lambda path, **kwargs: killed_while_writing(path))
    with pytest.raises(KeyboardInterrupt):
        train(CONFIG, tmp_path, log=quiet)
    assert not list((tmp_path / "checkpoints").glob("*.zip"))


def test_a_damaged_checkpoint_is_a_one_line_error_naming_it(tmp_path, capsys):
    """As an older rlalloc killed while saving it left it."""
    out = tmp_path / "model"
    train(replace(CONFIG, timesteps=256), out, log=quiet)
    newest = out / "checkpoints" / "step_256_steps.zip"
    newest.write_bytes(newest.read_bytes()[:1000])
    code, error, _ = run_cli([*TRAIN, "--timesteps", "384", "--resume", "--out", str(out)],
                             capsys)
    assert code == 2 and str(newest) in error and "damaged checkpoint" in error, error
    assert "delete it to resume from the one before" in error, error


def test_a_policy_killed_while_being_exported_keeps_the_earlier_one(tmp_path, monkeypatch):
    """Exported at every better evaluation: written in place, a kill mid-write left a
    truncated policy.pt that neither a resume nor the actuator could load."""
    from rlalloc.agent import deployed

    train(replace(CONFIG, timesteps=0), tmp_path, log=quiet)
    before = (tmp_path / "policy.pt").read_bytes()

    monkeypatch.setattr(deployed.torch, "save", lambda obj, f, **kw: killed_while_writing(f))
    meta = deployed.load_deployed(tmp_path).meta
    with pytest.raises(KeyboardInterrupt):
        deployed.save_deployed(tmp_path, meta, {})
    assert (tmp_path / "policy.pt").read_bytes() == before


def test_heuristic_scores_keep_told_names_apart_and_say_unfinished():
    """A told heuristic's name has commas in it, so the scores are "name: value" split by
    semicolons; a heuristic that left jobs unfinished (null in card.json) reads so instead of
    crashing `train`'s last line."""
    from rlalloc.agent.model_card import heuristic_scores

    line = heuristic_scores({"heuristic_avg_jct_s": {
        "elastic-srpt-0.25, sizes learned, speeds profiled": 2885.2, "static": None}})
    assert line == "elastic-srpt-0.25, sizes learned, speeds profiled: 2,885 s; static: unfinished"


def test_train_says_which_step_it_exported_and_what_the_heuristics_scored(tmp_path, capsys):
    """The last line is what a user reads: which policy was saved (the start, if RL never beat
    it) and the heuristics' score on the same evaluation, not only a JCT without a yardstick."""
    assert main([*TRAIN, "--out", str(tmp_path / "m")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    card = json.loads((tmp_path / "m" / "card.json").read_text())
    assert f"the policy of step {card['exported_timesteps']:,}" in last
    assert f"elastic: {card['heuristic_avg_jct_s']['elastic']:,.0f} s;" in last
    assert f"static: {card['heuristic_avg_jct_s']['static']:,.0f} s" in last


def test_one_workload_file_by_two_paths_is_given_twice(tmp_path, capsys):
    """Two paths of one file ran its runs twice as independent ones ("2/2 better")."""
    (tmp_path / "sub").mkdir()
    workload = tmp_path / "w.csv"
    workload.write_text("job_id,submit_s,num_gpus,duration_s\na,0,1,60\n")
    other = tmp_path / "sub" / ".." / "w.csv"
    code = main(["evaluate", "--workload", str(workload), "--workload", str(other),
                 "--cluster", "2x4", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"{other} is given twice (as {workload}: the same file)" in err[0]
    assert not (tmp_path / "out").exists()


def test_efficiency_takes_a_workload_without_applications_beside_one_with_them(tmp_path):
    """Refused only where it would change nothing at all: beside a workload whose jobs name an
    application, a generic workload's jobs simply stay generic."""
    from rlalloc.env.scenario import build_scenario, require_applications

    pollux = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "pollux"
                 / "workloads" / "workload-1.csv")
    if not Path(pollux).is_file():
        pytest.skip("needs the shared Pollux workloads")
    both = [build_scenario(w, "16x4", efficiency="adaptive") for w in (pollux, "synthetic:8")]
    require_applications(both, "adaptive", [pollux, "synthetic:8"])
    with pytest.raises(UserError, match="no job of synthetic:8 names an application"):
        require_applications(both[1:], "adaptive", ["synthetic:8"])
