"""The node-failure risk model on simulated telemetry: warned-then-failing nodes rank first."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from rlalloc.env.failures import NodeTelemetrySample
from rlalloc.forecaster.risk import RiskConfig, RiskModel, lagged
from rlalloc.forecaster.risk_eval import any_xid_rule, roc_auc, score_risk
from rlalloc.forecaster.risk_train import simulate, train_risk_model

SMALL = replace(RiskConfig(), n_nodes=16, duration_days=4.0, epochs=150)


@pytest.fixture(scope="module")
def model_and_test():
    model = train_risk_model(SMALL, simulate(SMALL, seed=0))
    return model, simulate(SMALL, seed=1)


def test_warned_then_failing_nodes_rank_above_healthy_ones(model_and_test):
    model, sample = model_and_test
    risk = model.predict_sample(sample)
    labels = sample.labels(SMALL.horizon_s)
    warned = labels & (sample.features.sum(axis=-1) > 0) & ~sample.down
    never_warned = np.flatnonzero(sample.features.sum(axis=(0, 2)) == 0)
    assert warned.sum() > 20 and len(never_warned) > 0
    healthy = risk[:, never_warned]
    assert np.median(risk[warned]) > healthy.max()
    assert roc_auc(risk[~sample.down], labels[~sample.down]) > 0.6


def test_model_beats_any_xid_rule_on_auc(model_and_test):
    model, sample = model_and_test
    ours = score_risk(model.predict_sample(sample), sample, SMALL.horizon_s, 0.05)
    rule = score_risk(any_xid_rule(sample), sample, SMALL.horizon_s, 0.5)
    assert ours["roc_auc"] > rule["roc_auc"]
    assert set(ours["recall_at_lead_s"]) == {"15", "60", "250", "600"}


def test_save_load_round_trip(model_and_test, tmp_path):
    model, sample = model_and_test
    model.save(tmp_path)
    loaded = RiskModel.load(tmp_path)
    np.testing.assert_allclose(loaded.predict_sample(sample), model.predict_sample(sample))
    assert loaded.config == model.config


def test_roc_auc_known_values():
    assert roc_auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([False, False, True, True])) == 1.0
    assert roc_auc(np.array([0.5, 0.5]), np.array([False, True])) == 0.5


def test_lagged_shifts_by_the_lag_and_pads_with_zeros():
    features = np.arange(1.0, 7.0).reshape(3, 2, 1)  # (T=3, nodes=2, F=1)
    now, earlier = lagged(features, 1)
    assert now is features
    assert earlier[:, :, 0].tolist() == [[0.0, 0.0], [1.0, 2.0], [3.0, 4.0]]
    assert lagged(features, 0)[1].tolist() == features.tolist()  # no lag: the same readings
    assert not lagged(features, 5)[1].any()  # a lag longer than the sample: all zeros


def test_scores_of_a_sample_without_failures_are_strict_json():
    """Its ROC AUC is undefined: null in the card, not a bare NaN."""
    sample = NodeTelemetrySample(times_s=np.arange(10) * 60.0, features=np.zeros((10, 2, 1)),
                                 feature_names=("xid_30m",), fail_times_s=(np.array([]),) * 2,
                                 down=np.zeros((10, 2), dtype=bool))
    scores = score_risk(np.full((10, 2), 0.1), sample, 3600.0, 0.5)
    assert scores["roc_auc"] is None
    json.dumps(scores, allow_nan=False)


def test_the_shipped_card_scores_the_model_where_the_policies_act_on_it():
    """The card reported its scores at a best-F1 cut (0.048) that no policy applied; a node is
    at risk from `RISKY_NODE_SCORE` on, so that is where the shipped model must be scored."""
    from pathlib import Path

    from rlalloc.env.featurizer import RISKY_NODE_SCORE

    risk = Path(__file__).resolve().parents[1] / "models" / "risk"
    card = json.loads((risk / "card.json").read_text())
    assert card["alarm_threshold"] == card["test_scores"]["logistic"]["threshold"]
    assert card["alarm_threshold"] == RISKY_NODE_SCORE
    assert "threshold" not in json.loads((risk / "risk_model.json").read_text())
