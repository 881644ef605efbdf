"""Load a trained demand-forecaster directory for `forecast evaluate`, checked as a whole: the
LSTM (`rlalloc.forecaster.lstm_dir`), its stand-in and the fitted baselines. The checks that
need two of its files (the stand-in's horizons against the LSTM's) happen here, once, so that a
broken directory ends in one line before any result is written, never in a NaN score.
"""

from __future__ import annotations

from pathlib import Path

from rlalloc.env.errors import UserError
from rlalloc.forecaster.artifacts import BASELINES_FILE, load_baselines
from rlalloc.forecaster.lstm_dir import RETRAIN, load_lstm_dir, load_or_explain, require_files
from rlalloc.forecaster.model import CONFIG_FILE, WEIGHTS_FILE, LSTMForecaster
from rlalloc.forecaster.quantile_baselines import FittedBaselines
from rlalloc.forecaster.standin import STANDIN_FILE, EWMAForecaster, load_standin


def load_model_dir(
    model: Path, needs_horizon_min: int
) -> tuple[LSTMForecaster, EWMAForecaster, FittedBaselines]:
    """The LSTM, its stand-in and the fitted baselines of ``model``, or a one-line `UserError`
    naming the file at fault. ``needs_horizon_min`` is a horizon the caller reads (the
    evaluation figure's), which the model must forecast."""
    require_files(model, (CONFIG_FILE, WEIGHTS_FILE, STANDIN_FILE, BASELINES_FILE))
    lstm = load_lstm_dir(model, needs_horizon_min)
    standin = load_or_explain(model, STANDIN_FILE, load_standin)
    fitted = load_or_explain(model, BASELINES_FILE, load_baselines)
    if standin.horizons_min != lstm.horizons_min:
        raise UserError(f"--model {model}: {STANDIN_FILE} forecasts {list(standin.horizons_min)} "
                        f"minutes ahead but {CONFIG_FILE} {list(lstm.horizons_min)}; {RETRAIN}")
    if (fitted.naive.horizons_min, fitted.naive.levels) != (lstm.horizons_min, lstm.quantiles):
        raise UserError(f"--model {model}: {BASELINES_FILE} forecasts levels "
                        f"{list(fitted.naive.levels)} at {list(fitted.naive.horizons_min)} "
                        f"minutes but {CONFIG_FILE} {list(lstm.quantiles)} at "
                        f"{list(lstm.horizons_min)}; {RETRAIN}")
    return lstm, standin, fitted
