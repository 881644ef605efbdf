"""Load the LSTM of a trained demand-forecaster directory, with one-line errors.

Its files are written together by `forecast train` but can be damaged, copied in part, or edited
apart: each is loaded with an error naming it, so that a broken directory ends in one line
before any result is written, never in a traceback. Only the LSTM's files are read here, so
`forecast predict` runs on the core install; `rlalloc.forecaster.model_dir` adds the stand-in
and the baselines that `forecast evaluate` scores beside it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rlalloc.env.errors import UserError
from rlalloc.forecaster.model import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    LSTMForecaster,
    load_demand_forecaster,
)
from rlalloc.forecaster.risk import RISK_MODEL_FILE

RETRAIN = "train it again with `forecast train --out DIR --force`"
"""What to do about a damaged model directory."""
Loaded = TypeVar("Loaded")


def require_files(model: Path, names: tuple[str, ...]) -> None:
    """A one-line `UserError` when ``model`` is a risk model's directory or lacks one of
    ``names``."""
    if (model / RISK_MODEL_FILE).is_file():  # whose fix is not to train over it
        raise UserError(f"--model {model}: holds a node-failure risk model (`forecast train "
                        "--model risk`), not a demand forecaster; pass a `forecast train "
                        "--model demand` directory (the shipped one: models/forecaster)")
    for name in names:
        if not (model / name).is_file():
            raise UserError(f"--model {model}: no {name}; pass a complete `forecast train "
                            "--out` directory, or train one again into it with --force")


def load_lstm_dir(model: Path, needs_horizon_min: int) -> LSTMForecaster:
    """The LSTM of ``model``, or a one-line `UserError` naming the file at fault.
    ``needs_horizon_min`` is a horizon the caller reads, which the model must forecast."""
    require_files(model, (CONFIG_FILE, WEIGHTS_FILE))
    lstm = load_or_explain(model, f"{CONFIG_FILE} and {WEIGHTS_FILE}", load_demand_forecaster)
    if needs_horizon_min not in lstm.horizons_min:
        raise UserError(f"--model {model}: {CONFIG_FILE} forecasts {list(lstm.horizons_min)} "
                        f"minutes ahead, without the {needs_horizon_min} minutes this command "
                        f"needs; {RETRAIN}")
    return lstm


def load_or_explain(model: Path, files: str, loader: Callable[[Path], Loaded]) -> Loaded:
    """``loader(model)``, with whatever a damaged ``files`` raises (bad JSON, a missing key, a
    cut or empty torch file, a bad value) turned into one line naming them."""
    try:
        return loader(model)
    except pickle.UnpicklingError as err:
        raise UserError(f"--model {model}: {WEIGHTS_FILE} is not a torch state_dict; "
                        f"{RETRAIN}") from err
    except (OSError, EOFError, ValueError, KeyError, TypeError, RuntimeError) as err:
        if isinstance(err, KeyError):
            cause = f"no {err} entry"
        elif isinstance(err, EOFError):  # torch.load of an empty file, whose message is empty
            cause = "empty or cut short"
        else:
            cause = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"--model {model}: cannot load {files} ({cause[:200]}); "
                        f"{RETRAIN}") from err
