"""Everything a trained forecaster directory holds besides the LSTM itself.

``baselines.json`` keeps the Holt-Winters parameters fitted on the training series, so
evaluation judges every model on the same footing; ``card.json`` says what the model was
trained on and with which command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forecaster.baselines import HoltWintersParams

BASELINES_FILE = "baselines.json"
CARD_FILE = "card.json"


def save_baselines(directory: Path, holt_winters: HoltWintersParams) -> None:
    """Write the fitted baseline parameters."""
    data = {"holt_winters": holt_winters.to_json()}
    (directory / BASELINES_FILE).write_text(json.dumps(data, indent=2) + "\n")


def load_baselines(directory: Path) -> HoltWintersParams:
    """Holt-Winters parameters saved by `save_baselines`."""
    data = json.loads((directory / BASELINES_FILE).read_text())
    return HoltWintersParams(**data["holt_winters"])


def write_card(directory: Path, card: dict[str, Any]) -> None:
    """Write the machine-readable model card."""
    (directory / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")


def read_card(directory: Path) -> dict[str, Any]:
    """Read the machine-readable model card."""
    return json.loads((directory / CARD_FILE).read_text())
