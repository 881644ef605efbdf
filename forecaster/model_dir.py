"""Load a trained demand-forecaster directory for `forecast evaluate`, checked as a whole.

Its files are written together by `forecast train` but can be damaged, copied in part, or edited
apart: each is loaded with an error naming it, and the checks that need two of them (the
stand-in's horizons against the LSTM's) happen here, once, so that a broken directory ends in
one line before any result is written, never in a traceback or a NaN score.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rlalloc.env.errors import UserError
from rlalloc.forecaster.artifacts import BASELINES_FILE, load_baselines
from rlalloc.forecaster.model import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    LSTMForecaster,
    load_demand_forecaster,
)
from rlalloc.forecaster.quantile_baselines import FittedBaselines
from rlalloc.forecaster.risk import RISK_MODEL_FILE
from rlalloc.forecaster.standin import STANDIN_FILE, EWMAForecaster, load_standin

RETRAIN = "train it again with `forecast train --out DIR --force`"
"""What to do about a damaged model directory."""
Loaded = TypeVar("Loaded")


def load_model_dir(
    model: Path, needs_horizon_min: int
) -> tuple[LSTMForecaster, EWMAForecaster, FittedBaselines]:
    """The LSTM, its stand-in and the fitted baselines of ``model``, or a one-line `UserError`
    naming the file at fault. ``needs_horizon_min`` is a horizon the caller reads (the
    evaluation figure's), which the model must forecast."""
    if (model / RISK_MODEL_FILE).is_file():  # whose fix is not to train over it
        raise UserError(f"--model {model}: holds a node-failure risk model (`forecast train "
                        "--model risk`), not a demand forecaster; pass a `forecast train "
                        "--model demand` directory (the shipped one: models/forecaster)")
    for name in (CONFIG_FILE, WEIGHTS_FILE, STANDIN_FILE, BASELINES_FILE):
        if not (model / name).is_file():
            raise UserError(f"--model {model}: no {name}; pass a complete `forecast train "
                            "--out` directory, or train one again into it with --force")
    lstm = _load(model, f"{CONFIG_FILE} and {WEIGHTS_FILE}", load_demand_forecaster)
    standin = _load(model, STANDIN_FILE, load_standin)
    fitted = _load(model, BASELINES_FILE, load_baselines)
    if standin.horizons_min != lstm.horizons_min:
        raise UserError(f"--model {model}: {STANDIN_FILE} forecasts {list(standin.horizons_min)} "
                        f"minutes ahead but {CONFIG_FILE} {list(lstm.horizons_min)}; {RETRAIN}")
    if needs_horizon_min not in lstm.horizons_min:
        raise UserError(f"--model {model}: {CONFIG_FILE} forecasts {list(lstm.horizons_min)} "
                        f"minutes ahead, without the {needs_horizon_min} minutes evaluation "
                        f"needs; {RETRAIN}")
    if (fitted.naive.horizons_min, fitted.naive.levels) != (lstm.horizons_min, lstm.quantiles):
        raise UserError(f"--model {model}: {BASELINES_FILE} forecasts levels "
                        f"{list(fitted.naive.levels)} at {list(fitted.naive.horizons_min)} "
                        f"minutes but {CONFIG_FILE} {list(lstm.quantiles)} at "
                        f"{list(lstm.horizons_min)}; {RETRAIN}")
    return lstm, standin, fitted


def _load(model: Path, files: str, loader: Callable[[Path], Loaded]) -> Loaded:
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
