"""One entry point for every workload source: an embedded generator,
``synthetic[:NUM_JOBS[:LOAD[:MAX_HOURS]]]`` (Philly-like, `rlalloc.env.workload.synthetic`) or
``synthetic-fleet[:NUM_JOBS[:LOAD[:MAX_HOURS]]]`` (LLM jobs of 8-GPU workers,
`rlalloc.env.workload.fleet`), or a CSV path (MAX_HOURS caps generated run times; see
`SyntheticConfig.max_duration_s`).

A CSV's format is recognised from its header (see docs/workloads.md):

* Philly: ``timestamp,duration,num_gpus,...`` (`rlalloc.env.workload.philly`)
* Pollux: ``name,time,application,num_replicas,batch_size`` (`rlalloc.env.workload.pollux`)
* canonical: ``job_id,submit_s,num_gpus,duration_s,...`` (`rlalloc.env.workload.canonical`)
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from rlalloc.env.cluster import ClusterSpec
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import profiles_or_default
from rlalloc.env.workload.canonical import (
    CANONICAL_COLUMNS,
    CANONICAL_OPTIONAL_COLUMNS,
    load_canonical,
)
from rlalloc.env.workload.fleet import FLEET, FleetConfig, generate_fleet
from rlalloc.env.workload.philly import PHILLY_COLUMNS, load_philly
from rlalloc.env.workload.pollux import POLLUX_COLUMNS, load_pollux
from rlalloc.env.workload.spec import Workload
from rlalloc.env.workload.synthetic import SyntheticConfig, generate
from rlalloc.env.workload.table import reject_directory, require_columns

SYNTHETIC = "synthetic"
"""Source name of the embedded Philly-like generator (`rlalloc.env.workload.synthetic`)."""
GENERATORS: dict[str, tuple[type, Callable[..., Workload]]] = {
    SYNTHETIC: (SyntheticConfig, generate),
    FLEET: (FleetConfig, generate_fleet),
}
"""Each embedded generator by its source name: its config type (fields num_jobs, load, seed,
max_duration_s) and the function drawing a workload from it for a cluster."""
GENERATED_SOURCES = (f"{SYNTHETIC}[:NUM_JOBS[:LOAD[:MAX_HOURS]]] (Philly-like) or "
                     f"{FLEET}[:NUM_JOBS[:LOAD[:MAX_HOURS]]] (LLM jobs of 8-GPU workers)")
"""The generated sources as users write them, for messages and every command's --help."""
EMBEDDED_DEFAULT = "synthetic:160:3:12"
"""The default workload of every command: 160 Philly-like jobs (the size of a Pollux workload)
at offered load 3, so that queues form on a 16x4 cluster, with run times capped at 12 h so one
replay takes about a second. Needs no data files."""
_FORMATS = (("Philly", PHILLY_COLUMNS), ("Pollux", POLLUX_COLUMNS),
            ("canonical", CANONICAL_COLUMNS))
"""Workload formats by their required columns, in the order a header is matched against them."""
_OPTIONAL = {"canonical": CANONICAL_OPTIONAL_COLUMNS}
"""Each format's optional columns, where it has any."""
_USAGE = f"give a CSV path, {GENERATED_SOURCES} (e.g. {SYNTHETIC}:500:0.9:24)"


def load_workload(
    source: str, cluster: ClusterSpec, profiles_root: Path | None = None, seed: int = 0
) -> Workload:
    """The workload named by `source`, sized for `cluster`.

    `profiles_root` is the Pollux ``app_profiles`` folder, needed by Pollux workloads and by
    canonical rows that name an application; by default `RLALLOC_PROFILES` or the shipped
    Pollux profiles. `seed` seeds the generators (files are deterministic).
    """
    generator = generator_of(source)
    if generator is not None:
        config_type, draw = GENERATORS[generator]
        return draw(_generator_config(source, config_type, seed), cluster)
    path = Path(source)
    fmt = workload_format(path)
    header = _header(path)
    if fmt == "Philly":
        return load_philly(path, cluster)
    if fmt == "Pollux":
        return load_pollux(path, cluster, profiles_or_default(profiles_root))
    needs_profiles = "application" in header
    profiles = profiles_or_default(profiles_root) if needs_profiles else None
    return load_canonical(path, cluster, profiles)


def workload_format(path: Path) -> str:
    """The format of the workload CSV at `path` ("Philly", "Pollux" or "canonical"), from its
    header alone; a one-line `UserError` for a directory, a missing file or a header of no
    format. Cheap, so a command can check a file this way before minutes of other work and
    load its rows later."""
    reject_directory(path, f"a workload is a CSV file: {_USAGE}")
    if not path.is_file():
        raise UserError(f"{path}: no such workload file; {_USAGE}")
    return _format_of(path, _header(path))


def _format_of(path: Path, header: set[str]) -> str:
    """The format whose required columns `header` holds, else the one it shares the most
    columns with, whose missing columns the error names: a forgotten column is far more
    common than a file of another format. Ties go to the earlier of `_FORMATS`."""
    fmt, required = max(_FORMATS, key=lambda f: (set(f[1]) <= header, len(header & set(f[1]))))
    if not header & set(required):
        formats = ", ".join(f"{','.join(columns)} ({name})" for name, columns in _FORMATS)
        problem = "the file is empty" if not header - {""} else "header matches no workload format"
        raise UserError(f"{path}: {problem}; start the file with a header line, one of "
                        f"{formats}; see docs/workloads.md")
    require_columns(path, header, required, fmt, _OPTIONAL.get(fmt, ()))
    return fmt


def generator_of(source: str) -> str | None:
    """The name of the embedded generator `source` names (``NAME`` or ``NAME:FIELDS``), or None
    for a CSV path."""
    name = source.split(":", 1)[0]
    return name if name in GENERATORS else None


def _generator_config(
    source: str, config_type: type[SyntheticConfig] | type[FleetConfig], seed: int
) -> SyntheticConfig | FleetConfig:
    """A generator's config from ``NAME[:NUM_JOBS[:LOAD[:MAX_HOURS]]]``, the defaults of
    `config_type` for the fields left out; the ranges are checked by the config itself."""
    parts = source.split(":")[1:]
    if len(parts) > 3:
        raise UserError(f"workload {source!r}: too many fields; {_USAGE}")
    try:
        num_jobs = int(parts[0]) if parts else config_type.num_jobs
        load = float(parts[1]) if len(parts) > 1 else config_type.load
        cap_s = float(parts[2]) * 3600.0 if len(parts) > 2 else config_type.max_duration_s
    except ValueError as err:
        raise UserError(f"workload {source!r}: NUM_JOBS must be an integer, LOAD and MAX_HOURS "
                        f"numbers; {_USAGE}") from err
    return config_type(num_jobs=num_jobs, load=load, seed=seed, max_duration_s=cap_s)


def _header(path: Path) -> set[str]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            first = next(csv.reader(f), [])
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text; save the workload as a UTF-8 CSV") from err
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror}); check the file") from err
    return {column.strip() for column in first}

