"""A heuristic told job sizes and speeds from history, saved as a policy directory.

`rlalloc sizes fit` saves an elastic heuristic with the size table it is told
(`rlalloc.agent.job_sizes`) and copies of the measured profiles that tell it job speeds
(`rlalloc.agent.job_speeds`): ``sizes.json`` + ``card.md`` + ``profiles/``. `load_policy` runs it
by path, in the simulator, `evaluate` and the actuator alike, since it reads nothing but the
`ClusterState`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from rlalloc.agent.job_sizes import SIA, SIA_SPEEDS, JobSizeHistory, told_sizes
from rlalloc.agent.job_speeds import (
    PROFILES_DIR,
    copy_profiles,
    read_copied_profiles,
    speedups_of,
)
from rlalloc.agent.policy import Policy
from rlalloc.env.errors import UserError

SIZES_FILE = "sizes.json"
"""The size table and its base heuristic, in a policy directory written by `rlalloc sizes fit`."""
FORMAT_VERSION = 1


def save_sized_policy(directory: Path, base: str, sizes: JobSizeHistory,
                      fitted_on: Sequence[str], command: str, cluster: str,
                      profiles_root: Path | None) -> list[str]:
    """Write `SIZES_FILE`, a card and the profiles under `profiles_root` of the applications
    `sizes` names (`rlalloc.agent.job_speeds`) for `base` told job sizes and speeds by `sizes`,
    fitted on the workloads `fitted_on` built for `cluster` (--cluster as given; a YAML file's
    content is recorded too, `cluster_record`); the applications whose profiles were copied
    (none for `sia`, which needs no speed-ups). All of them replace an earlier fit's together
    or not at all."""
    from rlalloc.env.cluster import cluster_markdown, cluster_record
    from rlalloc.env.output import remove_outputs, staged_outputs, write_atomic, write_json

    cluster_file = cluster_record(cluster)
    rows = list(dict.fromkeys(  # a kind has a curve per epoch under statistical efficiency
        f"| {_kinds_label(e['kinds'])} | {e['work_s']:,.0f} | {e['jobs']} |"
        for e in sizes.to_json()))
    shape = f" ({cluster_file['shape']}, the file as used is below)" if cluster_file else ""
    with staged_outputs(directory) as staging:
        copied = copy_profiles(sizes, None if base == SIA else profiles_root, staging)
        write_json(staging / SIZES_FILE, {"format_version": FORMAT_VERSION, "base": base,
                                          "fitted_on": list(fitted_on), "cluster": cluster,
                                          "cluster_file": cluster_file, "profiles": copied,
                                          "curves": sizes.to_json()})
        speeds = (f"Speed-ups: none, {SIA_SPEEDS}." if base == SIA else
                  f"Its speed-ups are the measured profiles of {', '.join(copied)} "
                  f"({PROFILES_DIR}/, `agent/job_speeds.py`) for the jobs of those kinds, the "
                  "state's fitted curve for others." if copied else
                  "Its speed-ups are the state's fitted curve (`--speeds curves`, or no "
                  "profiles found).")
        told = ("Sia's integer program with each job's term weighted by its rank in remaining "
                "work (`agent/sia.py`, `size_weights`), taken from the median size of past jobs "
                "with the same speed curve (`agent/job_sizes.py`). A job runs on the curve of "
                "its application and batch size; jobs of a kind not below rank as the median "
                "known job." if base == SIA else
                f"The heuristic `{base}` with each job's remaining work taken from the median "
                "size of past jobs with the same speed curve (`agent/job_sizes.py`), where it "
                "would otherwise extrapolate it from progress. A job runs on the curve of its "
                "application and batch size; jobs of a kind not below keep the estimate.")
        write_atomic(staging / "card.md", "\n".join([
            f"# `{base}`, told job sizes{'' if base == SIA else ' and speeds'} from history", "",
            f"{told} (The curves themselves are in {SIZES_FILE}.) {speeds}", "",
            f"Fitted on {len(fitted_on)} workload(s): {', '.join(fitted_on)}; cluster "
            f"{cluster}{shape}.", "",
            f"Command: `{command}`", "",
            "| application (batch size) | median size (1-GPU s) | past jobs |",
            "|---|---|---|", *rows,
            *(["", *cluster_markdown(cluster_file)] if cluster_file else []), ""]))
    if not copied:  # an earlier fit's profiles must not pass for this one's
        remove_outputs(directory, [PROFILES_DIR])
    return copied


def _kinds_label(kinds: list[dict]) -> str:
    """``bert (batch 12)``, ``cifar10 (batch 128, 256)``: the jobs behind one curve of the
    table, by application and batch size."""
    batches: dict[str, list[str]] = defaultdict(list)
    for kind in kinds:
        batches[kind["application"]].append(str(kind["batch_size"]))
    return "; ".join(f"{application} (batch {', '.join(sizes)})"
                     for application, sizes in batches.items())


def read_saved_policy(path: Path, format_version: int, command: str) -> dict:
    """The JSON object a policy directory's `path` holds, written in `format_version`: a
    `UserError` naming `command` (that fits it again) for another version; OSError, ValueError
    or TypeError for a file that is missing, not JSON or not an object, which the caller words
    with what the file is."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise TypeError(f"it holds a {type(raw).__name__}, not an object")
    if raw.get("format_version") != format_version:
        raise UserError(f"{path}: format_version {raw.get('format_version')!r}, this rlalloc "
                        f"reads {format_version}; fit it again with `{command}`")
    return raw


def load_sized_policy(directory: Path, name: str | None = None) -> Policy:
    """The policy saved by `save_sized_policy` in `directory`; a damaged file is a `UserError`.
    A table saved before profiles were copied (no ``profiles``) keeps the curves."""
    path = Path(directory) / SIZES_FILE
    try:
        raw = read_saved_policy(path, FORMAT_VERSION, "rlalloc sizes fit")
        base = str(raw["base"])
        sizes = JobSizeHistory.from_json(raw["curves"])
        applications = [str(a) for a in raw.get("profiles", [])]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: damaged size table ({err.__class__.__name__}: "
                        f"{str(err).splitlines()[0][:120]}); fit it again with "
                        "`rlalloc sizes fit`") from err
    models = read_copied_profiles(Path(directory), applications, sizes, "rlalloc sizes fit")
    try:
        return told_sizes(base, sizes.remaining_work, name or Path(directory).name,
                          speedups_of(models))
    except UserError as err:
        raise UserError(f"{path}: base {err}; fit it again with `rlalloc sizes fit`") from err
