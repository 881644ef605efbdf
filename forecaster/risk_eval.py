"""Score node-failure risk predictions the way a proactive failover experiences them.

A proactive move pays the job's checkpoint-restore time (15-250 s), so an alarm is worth
something only if it comes at least that long before the failure. Reported:

* ``recall_at_lead_s``: share of failures whose node was alarmed at the last sample at least
  *lead* seconds before the failure (failures without a warning episode count as misses);
* ``alarm_precision``: share of alarms followed by that node's failure within the horizon (the
  rest are moves wasted on healthy nodes). An alarm is a node's score crossing the threshold
  with no alarm on that node in the preceding `ALARM_COOLDOWN_S`, as the actuator's per-job
  cooldown would act on it;
* sample-level precision/recall of "fails within the horizon" and the ROC AUC of the scores
  (``None`` where the sample lacks failing or healthy node-minutes, so it has none).
"""

from __future__ import annotations

import math

import numpy as np

from rlalloc.env.failures import NodeTelemetrySample

LEADS_S: tuple[float, ...] = (15.0, 60.0, 250.0, 600.0)
"""Lead times reported: the cheapest (ncf) and dearest (imagenet) restore, and beyond."""
ALARM_COOLDOWN_S = 1800.0
"""A node alarmed within this long before is not alarmed (moved) again."""


def any_xid_rule(sample: NodeTelemetrySample) -> np.ndarray:
    """The threshold rule to beat: 1 when the node logged any XID error in the last 30 min."""
    column = sample.feature_names.index("xid_30m")
    return (sample.features[:, :, column] > 0).astype(np.float64)


def best_f1_threshold(scores: np.ndarray, sample: NodeTelemetrySample, horizon_s: float) -> float:
    """Threshold maximising sample-level F1 (chosen on training data, applied to test data)."""
    up = ~sample.down
    labels = sample.labels(horizon_s)[up]
    values = scores[up]
    best, best_f1 = 0.5, -1.0
    for threshold in np.unique(np.quantile(values, np.linspace(0.5, 0.9999, 400))):
        alarm = values >= threshold
        true_pos = np.sum(alarm & labels)
        f1 = 2 * true_pos / max(alarm.sum() + labels.sum(), 1)
        if f1 > best_f1:
            best, best_f1 = float(threshold), f1
    return best


def score_risk(
    scores: np.ndarray, sample: NodeTelemetrySample, horizon_s: float, threshold: float
) -> dict[str, object]:
    """All metrics of one (T, n_nodes) score array against ``sample``'s failures."""
    up = ~sample.down
    labels = sample.labels(horizon_s)
    alarm = (scores >= threshold) & up
    true_pos = int(np.sum(alarm & labels))
    recall_at_lead = {}
    n_failures = sum(len(f) for f in sample.fail_times_s)
    for lead in LEADS_S:
        caught = 0
        for node, fails in enumerate(sample.fail_times_s):
            index = np.searchsorted(sample.times_s, fails - lead, side="right") - 1
            caught += int(np.sum(alarm[index[index >= 0], node]))
        recall_at_lead[f"{lead:g}"] = caught / max(n_failures, 1)
    rising = _alarm_onsets(alarm, sample.times_s)
    auc = roc_auc(scores[up], labels[up])
    return {
        "threshold": threshold,
        "failures": n_failures,
        "alarms": int(rising.sum()),
        "alarm_precision": float(np.sum(rising & labels) / max(rising.sum(), 1)),
        "sample_precision": true_pos / max(int(alarm.sum()), 1),
        "sample_recall": true_pos / max(int(np.sum(labels & up)), 1),
        "roc_auc": None if math.isnan(auc) else auc,  # strict JSON: no bare NaN in the card
        "recall_at_lead_s": recall_at_lead,
    }


def _alarm_onsets(alarm: np.ndarray, times_s: np.ndarray) -> np.ndarray:
    """(T, N) True where a node alarms with no alarm in the previous `ALARM_COOLDOWN_S`."""
    onsets = np.zeros_like(alarm)
    for node in range(alarm.shape[1]):
        last_alarm_s = -np.inf
        for index in np.flatnonzero(alarm[:, node]):
            if times_s[index] - last_alarm_s > ALARM_COOLDOWN_S:
                onsets[index, node] = True
            last_alarm_s = times_s[index]
    return onsets


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability a random positive outranks a random negative (ties count half)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(average, counts)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
