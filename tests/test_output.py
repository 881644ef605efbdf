"""Results are written whole, readable like any file the user creates, and never replaced by
accident; numeric flags are checked where they are parsed."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from rlalloc.cli.argtypes import SEED, above, at_least, within
from rlalloc.cli.main import main
from rlalloc.env.errors import UserError
from rlalloc.env.output import out_dir_for_run, prepare_out_dir, prepare_out_file, write_atomic


def test_written_results_get_the_mode_open_would_give(tmp_path):
    umask = os.umask(0o022)
    try:
        path = tmp_path / "r.json"
        write_atomic(path, "{}")
        assert path.read_text() == "{}"
        assert path.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    finally:
        os.umask(umask)


def test_out_dir_and_file_refusals_name_the_problem(tmp_path):
    (tmp_path / "a.json").write_text("old")
    with pytest.raises(UserError, match="--force"):
        prepare_out_dir(tmp_path, ["a.json"], force=False)
    with pytest.raises(UserError, match="not a directory"):
        prepare_out_dir(tmp_path / "a.json", ["x"], force=True)
    with pytest.raises(UserError, match="is a directory"):
        prepare_out_file(tmp_path, force=False)
    with pytest.raises(UserError, match="cannot write in /proc"):  # even as root
        prepare_out_file(Path("/proc/figures.json"), force=False)
    assert (tmp_path / "a.json").read_text() == "old"


def test_a_stopped_run_removes_only_the_empty_directories_it_created(tmp_path):
    with pytest.raises(KeyboardInterrupt), out_dir_for_run(tmp_path / "a" / "b", [], False):
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(KeyboardInterrupt), out_dir_for_run(tmp_path / "a" / "b", [], False) as out:
        write_atomic(out / "part.json", "{}")
        raise KeyboardInterrupt
    assert (tmp_path / "a" / "b" / "part.json").read_text() == "{}"


@pytest.mark.parametrize("kind, good, bad", [
    (SEED, ("0", "7"), ("-1", "1.5", "x")),
    (at_least(1), ("1", "64"), ("0", "-3")),
    (above(0.0), ("0.5", "1e-9"), ("0", "-1", "inf", "nan")),
    (within(0.0, 1.0), ("0", "1", "0.99"), ("1.01", "-0.1", "nan")),
])
def test_flag_types_accept_and_refuse(kind, good, bad):
    for text in good:
        kind(text)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)


@pytest.mark.parametrize("command, default", [(["workload", "sample"], "runs/workloads"),
                                              (["sizes", "fit"], "runs/sizes"),
                                              (["headroom"], "runs/headroom"),
                                              (["evaluate"], "runs/evaluate")])
def test_help_says_where_results_go_by_default(capsys, command, default):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    assert f"output directory (default: {default})" in " ".join(capsys.readouterr().out.split())


def test_ctrl_c_while_a_command_is_still_loading_is_one_line(monkeypatch, capsys):
    """The first half second of a command imports its modules; Ctrl-C there is an interrupt,
    exit 130, not a KeyboardInterrupt traceback."""
    import rlalloc.cli.main as cli

    def loading(argv: list[str]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", loading)
    assert cli.main(["simulate"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["rlalloc: interrupted"]


def test_simulate_shows_each_metric_in_one_readable_format():
    from rlalloc.cli.simulate import metric_text

    # `.4g` mixed 1.134e+04 with 9,375 in one table
    assert [metric_text(v) for v in (11_340.4, 9_375.0, 0.3671, 12, 1.0)] == [
        "11,340", "9,375", "0.3671", "12", "1"]
