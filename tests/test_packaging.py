"""What a user installs: one top-level package, `rlalloc`, holding what the program reads at run
time; a light core that simulates and evaluates without the extras; the images install the
wheel, with no source tree on PYTHONPATH and nothing downloaded but packages."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
IMAGES = {"actuator": "actuator", "trainer-jobs": "trainer", "ray": "train,ray"}
"""Each image's build target in `DOCKERFILE` and the extras it installs rlalloc with."""
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS_ONLY = ("stable_baselines3", "sb3_contrib", "tensorboard", "statsmodels", "kubernetes",
               "prometheus_api_client", "prometheus_client", "jsonschema", "kmock", "aiohttp")
"""Packages that only the extras bring: the core install has none of them."""


def _instructions(dockerfile: Path) -> list[tuple[str, list[str]]]:
    """(instruction, arguments), continuations joined, comments out."""
    lines = [line.strip() for line in dockerfile.read_text().splitlines()]
    joined = "\n".join(line for line in lines if not line.startswith("#")).replace("\\\n", " ")
    return [(line.split()[0].upper(), line.split()[1:]) for line in joined.splitlines() if line]


def _stages(dockerfile: Path) -> dict[str, list[tuple[str, list[str]]]]:
    """Each build stage's instructions by its name, with those of the stage it starts from
    (``FROM <stage> AS <name>``) first."""
    stages: dict[str, list[tuple[str, list[str]]]] = {}
    current: list[tuple[str, list[str]]] = []
    for name, args in _instructions(dockerfile):
        if name == "FROM":
            current = list(stages.get(args[0], []))
            stages[args[-1]] = current
        current.append((name, args))
    return stages


def _copied_sources(dockerfile: Path) -> list[str]:
    """What the wheel stage copies from the build context (the repository root)."""
    return [arg for name, args in _stages(dockerfile)["wheel"]
            if name == "COPY" and not any(a.startswith("--from") for a in args)
            for arg in args[:-1]]


def test_the_missing_extra_error_names_the_extra_that_lists_the_package():
    """`rlalloc.cli.main.EXTRAS` (which extra to install for a missing module) agrees with
    pyproject.toml's optional dependencies, and covers every package only an extra brings."""
    from rlalloc.cli.main import COMMAND_EXTRAS, COMMANDS, EXTRAS

    extras = PYPROJECT["project"]["optional-dependencies"]

    def listed(extra: str) -> set[str]:
        """The import names of the packages `extra` brings, with the extras it includes."""
        names = set()
        for requirement in extras[extra]:
            if included := re.fullmatch(r"rlalloc\[([\w,]+)\]", requirement):
                names |= {n for other in included[1].split(",") for n in listed(other)}
            else:
                names.add(re.split(r"[<>=\[;]", requirement)[0].strip().lower().replace("-", "_"))
        return names

    for package, extra in EXTRAS.items():
        assert package in listed(extra), (package, extra)
    assert set(EXTRAS) == set(EXTRAS_ONLY)
    assert set(COMMAND_EXTRAS.values()) <= set(extras)
    assert {words for words, _, _ in COMMANDS} >= set(COMMAND_EXTRAS)


def test_the_wheel_stage_copies_the_whole_package():
    sources = _copied_sources(DOCKERFILE)
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    # every folder the package maps is copied, so the wheel is the whole package
    assert set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()) <= set(sources)
    runs = [" ".join(args) for name, args in _stages(DOCKERFILE)["wheel"] if name == "RUN"]
    assert runs == ["pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ."]


@pytest.mark.parametrize("target", IMAGES)
def test_each_image_installs_the_wheel_with_its_extras(target):
    instructions = _stages(DOCKERFILE)[target]
    assert ("COPY", ["--from=wheel", "/wheels", "/wheels"]) in instructions
    pin = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch=="))
    runs = " ".join(" ".join(args) for name, args in instructions if name == "RUN")
    assert re.findall(r"torch==\S+", runs) == [pin]
    assert re.search(rf"rlalloc-\*\.whl\)?\[{IMAGES[target]}\]", runs)
    assert not re.search(r"pip install (-e|--editable)\b", runs)
    assert not [args for name, args in instructions
                if name == "ENV" and any("PYTHONPATH" in a for a in args)]
    assert not [args for name, args in instructions if name == "ADD"]  # no download at build


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built as the images build it, from what they copy."""
    source = tmp_path_factory.mktemp("context")
    for name in _copied_sources(DOCKERFILE):
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, source / name)
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(out), str(source)],
                   check=True, capture_output=True)
    (built,) = out.glob("rlalloc-*.whl")
    return built


@pytest.mark.expensive
def test_the_wheel_is_one_namespace_with_its_runtime_data(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert archive.read(top_level).decode().split() == ["rlalloc"]
    assert all(name.startswith(("rlalloc/", "rlalloc-")) for name in names)
    for needed in ("rlalloc/models/ppo/policy.pt", "rlalloc/models/dqn/policy.json",
                   "rlalloc/models/forecaster/weights.pt", "rlalloc/models/risk/risk_model.json",
                   "rlalloc/env/app_profiles/LICENSE",
                   "rlalloc/env/app_profiles/cifar10/placements.csv",
                   "rlalloc/actuator/twin/crds/kubeflow.org_pytorchjobs.v1.9.0.yaml",
                   "rlalloc/actuator/twin/crds/LICENSE",
                   "rlalloc/cli/main.py", "rlalloc/env/state.py"):
        assert needed in names, needed


def _core_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new virtual environment with the wheel installed and, for its dependencies only,
    this environment's packages (an editable rlalloc here is not picked up: its finder is
    installed by a .pth file there, which a path entry does not run)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(site), str(wheel)], check=True, capture_output=True)
    return venv / "bin" / "python"


def _blocking(extras: tuple[str, ...], statement: str) -> str:
    """Python code that runs `statement` as if the packages `extras` were not installed."""
    return ("import importlib.abc, sys\n"
            "class Missing(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name.partition('.')[0] in {extras!r}:\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Missing())\n" + statement)


@pytest.mark.expensive
def test_the_core_install_runs_from_anywhere_without_the_extras(wheel, tmp_path):
    """`pip install .` alone: `import env` is no module of ours; `rlalloc evaluate` runs the
    shipped PPO, `simulate` a Pollux-format workload on the shipped profiles and `forecast
    predict` a series with the shipped forecaster, from a directory that is not the checkout;
    `train` names the extra it needs."""
    python = _core_venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(statement: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), "-c", _blocking(EXTRAS_ONLY, statement)],
                              cwd=elsewhere, capture_output=True, text=True, timeout=300)

    located = run("import rlalloc.env.state as s; print(s.__file__)")
    assert located.returncode == 0, located.stderr
    assert Path(located.stdout.strip()).is_relative_to(python.parents[1])
    assert "No module named 'env'" in run("import env").stderr
    workload = elsewhere / "pollux.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\n"
                        "a,0,cifar10,2,128\nb,30,ncf,1,256\nc,60,cifar10,4,256\n")
    cli = "from rlalloc.cli.main import main; sys.exit(main({}))"
    evaluated = run(cli.format(["evaluate", "--workload", str(workload), "--cluster", "2x4",
                                "--policies", "tiresias,ppo", "--seeds", "1",
                                "--out", str(elsewhere / "eval")]))
    assert evaluated.returncode == 0, evaluated.stderr
    assert (elsewhere / "eval" / "results.json").is_file()
    simulated = run(cli.format(["simulate", "--workload", str(workload), "--cluster", "2x4",
                                "--policy", "elastic"]))
    assert simulated.returncode == 0, simulated.stderr
    series = elsewhere / "cluster.csv"  # two days of a plain demand series, a step between
    pd.DataFrame({"time": pd.date_range("2020-05-01", periods=2880, freq="min"),
                  "demand": np.repeat([0.5, 0.75], 1440)}).to_csv(series, index=False)
    predicted = run(cli.format(["forecast", "predict", "--series", str(series), "--gpus", "16"]))
    assert predicted.returncode == 0, predicted.stderr
    assert "| 60 min |" in predicted.stdout
    version = run(cli.format(["--version"]))
    assert version.stdout.strip() == f"rlalloc {PYPROJECT['project']['version']}"
    trained = run(cli.format(["train", "--out", str(elsewhere / "model")]))
    assert trained.returncode == 2
    assert trained.stderr.strip().splitlines() == [
        "rlalloc: error: rlalloc train needs the [train] extra (stable_baselines3 is not "
        "installed); pip install 'rlalloc[train]'"]
    for argv, extra in ((["twin"], "twin"), (["bench", "recovery"], "trainer"),
                        (["bench", "sim", "--trace", "synthetic:5"], "train")):
        refused = run(cli.format(argv))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip().splitlines()[-1].endswith(
            f"pip install 'rlalloc[{extra}]'"), refused.stderr
