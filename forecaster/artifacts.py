"""Everything a trained model directory holds besides the model itself, and how it is written.

``baselines.json`` keeps what the baselines learned from the training series (Holt-Winters
parameters, empirical error quantiles), so evaluation judges every model on the same footing;
``card.json`` says what the model was trained and validated on and with which command.
`staged_model_dir` writes a model's files so that a directory never holds half of one run's
files and half of another's. Every JSON file here is strict JSON: a NaN is an error when
written, never a bare ``NaN`` other readers reject.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlalloc.env.output import prepare_out_dir, staged_outputs
from rlalloc.forecaster.quantile_baselines import FittedBaselines

BASELINES_FILE = "baselines.json"
CARD_FILE = "card.json"


def save_baselines(directory: Path, fitted: FittedBaselines) -> None:
    """Write the fitted baselines."""
    text = json.dumps(fitted.to_json(), indent=2, allow_nan=False)
    (directory / BASELINES_FILE).write_text(text + "\n")


def load_baselines(directory: Path) -> FittedBaselines:
    """Baselines saved by `save_baselines`."""
    return FittedBaselines.from_json(json.loads((directory / BASELINES_FILE).read_text()))


def write_card(directory: Path, card: dict[str, Any]) -> None:
    """Write the machine-readable model card."""
    (directory / CARD_FILE).write_text(json.dumps(card, indent=2, allow_nan=False) + "\n")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes: which series a model was trained on, wherever a copy of
    it lies (`forecast evaluate` refuses them)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_card(directory: Path) -> dict[str, Any]:
    """Read the machine-readable model card."""
    return json.loads((directory / CARD_FILE).read_text())


@contextmanager
def staged_model_dir(out: Path, produces: list[str], force: bool) -> Iterator[Path]:
    """A hidden directory inside ``out`` to write a model's files into; they move into ``out``
    (one rename each) only when the block ends without an error.

    A model is several files that only make sense together: written in place, a run that fails
    or is stopped halfway leaves new weights beside an old card. Enter this before the minutes
    of training, not after: it refuses to replace any of ``produces`` without ``force``, and an
    ``out`` that is a file or cannot be written fails here.
    """
    out = prepare_out_dir(out, produces, force)
    with staged_outputs(out) as staging:
        yield staging
        written = {p.name for p in staging.iterdir()}
        assert written == set(produces), (written, produces)
