"""`rlalloc forecast predict`: the quantiles of a cluster's demand after the last minute of its
series, in whole GPUs, as a predictive autoscaler would read them.

    rlalloc forecast predict --series cluster.csv [--model DIR] [--gpus N]
        [--out forecast.json [--force]]

prints one row per horizon: each quantile of demand in the nearest whole GPUs (the capacity
rule's GPUs to keep for that level), from the LSTM calibrated online on the series' own past
outcomes (`rlalloc.forecaster.series_end`). ``--out`` also writes them as JSON (``{"series",
"model_dir", "origin", "last_demand", "size_gpus", "horizons_min", "quantiles", "demand":
[[...]], "gpus": [[...]], "outcomes_seen"}``), demand in fractions of the cluster. Needs the
core install only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlalloc.cli.argtypes import above, add_json_out_flags
from rlalloc.env.output import prepare_out_file, write_json_out
from rlalloc.forecaster.capacity import CAPACITY_HORIZON_MIN
from rlalloc.forecaster.lstm_dir import load_lstm_dir
from rlalloc.forecaster.model import SHIPPED_MODEL_DIR
from rlalloc.forecaster.series import check_filled_share, load_demand_series
from rlalloc.forecaster.series_end import SeriesEndForecast, forecast_series_end


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc forecast predict`."""
    parser.add_argument("--series", type=Path, required=True,
                        help="per-minute cluster CSV (the layouts `forecast train` reads) whose "
                             "last minute is now; its earlier minutes calibrate the quantiles")
    parser.add_argument("--model", type=Path, default=SHIPPED_MODEL_DIR,
                        help="trained forecaster directory (default: the shipped one)")
    parser.add_argument("--gpus", type=above(0.0), default=None,
                        help="the cluster's size in GPUs, which turns demand shares into GPUs "
                             "(default: the median of the file's total column; a plain "
                             "time,demand file has none, so give it)")
    add_json_out_flags(parser)


def run(args: argparse.Namespace) -> int:
    """Forecast from the series' end, print the table, write --out."""
    prepare_out_file(args.out, args.force)
    lstm = load_lstm_dir(args.model, CAPACITY_HORIZON_MIN)
    series = load_demand_series(args.series)
    print(check_filled_share(series))
    forecast = forecast_series_end(series, lstm, size_gpus=args.gpus)
    print(format_forecast(forecast, args.series.name))
    write_json_out(args.out, {
        "series": str(args.series),
        "model_dir": str(args.model),
        "origin": None if forecast.origin is None else forecast.origin.isoformat(),
        "last_demand": forecast.last_demand,
        "size_gpus": forecast.size_gpus,
        "horizons_min": list(forecast.horizons_min),
        "quantiles": list(forecast.quantiles),
        "demand": forecast.demand.tolist(),
        "gpus": forecast.gpus().tolist(),
        "outcomes_seen": forecast.outcomes_seen,
    })
    return 0


def format_forecast(forecast: SeriesEndForecast, name: str) -> str:
    """A line on where the forecast starts, then a Markdown table of each quantile at each
    horizon in whole GPUs (`SeriesEndForecast.gpus`)."""
    origin = "its last minute" if forecast.origin is None else f"{forecast.origin:%Y-%m-%d %H:%M}"
    now = forecast.last_demand * forecast.size_gpus
    lines = [
        f"{name}: demand after {origin} (now {forecast.last_demand:.3f} of the cluster, "
        f"{now:.1f} of {forecast.size_gpus:g} GPUs), calibrated online on "
        f"{forecast.outcomes_seen:,} past outcomes; each quantile in the nearest whole GPUs:",
        "| horizon | " + " | ".join(f"q{level:g}" for level in forecast.quantiles) + " |",
        "|" + "---|" * (1 + len(forecast.quantiles)),
    ]
    for horizon, gpus in zip(forecast.horizons_min, forecast.gpus(), strict=True):
        lines.append(f"| {horizon} min | " + " | ".join(str(n) for n in gpus) + " |")
    return "\n".join(lines)
