"""FedADT: adaptive KD weight, beta mixing, KD only for tau > 1, and that KD pulls the client toward the teacher."""

import numpy as np
import pytest
import torch

from asyncfl.models import build_model
from asyncfl.models.flat import load_flat, model_to_flat
from asyncfl.strategies import Arrival, StrategyResources
from asyncfl.strategies.fedadt import (FedADT, FedADTConfig, ServerSet, adaptive_kd_weight, fedadt_beta, fedadt_kd_loss,
                                       server_rows)


def test_adaptive_kd_weight_schedule():
    assert adaptive_kd_weight(0, 0.2, 0.6, 1000) == pytest.approx(0.2)
    assert adaptive_kd_weight(500, 0.2, 0.6, 1000) == pytest.approx(0.4)
    assert adaptive_kd_weight(5000, 0.2, 0.6, 1000) == pytest.approx(0.6)


def test_beta_is_inverse_sqrt():
    assert fedadt_beta(0) == 1.0
    assert fedadt_beta(3) == pytest.approx(0.5)


def test_kd_loss_by_hand():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[0.0, 0.0]])
    # Identical distributions: KL = 0; CE of uniform over 2 classes = ln 2.
    loss = fedadt_kd_loss(student, teacher, torch.tensor([1]), alpha=0.25, temperature=3.0)
    assert loss.item() == pytest.approx(0.75 * np.log(2))


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(40, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.int64)
    make = lambda: build_model("mlp", (1, 8, 8), 3)  # noqa: E731
    teacher = model_to_flat(build_model("mlp", (1, 8, 8), 3, seed=1))
    client = model_to_flat(build_model("mlp", (1, 8, 8), 3, seed=2))
    return make, ServerSet(x, y), teacher, client


def _arrival(weights, staleness):
    return Arrival(0, 0, staleness, weights, weights, 10, 0.1, 0.0)


def test_fresh_updates_are_mixed_without_distillation():
    make, server_set, teacher, client = _setup()
    strategy = FedADT(make, server_set)
    new = strategy.on_arrival(_arrival(client, staleness=1), teacher)
    beta = 1 / np.sqrt(2)
    assert np.allclose(new, (1 - beta) * teacher + beta * client, atol=1e-6)
    assert strategy.corrected == 0


def test_stale_updates_are_distilled_toward_the_global_model():
    make, server_set, teacher, client = _setup()
    strategy = FedADT(make, server_set, alpha_min=1.0, alpha_max=1.0, kd_lr=0.5, kd_batch_size=8)
    corrected = strategy.correct(client, teacher)

    def kl_to_teacher(weights):
        t, s = load_flat(make(), teacher).eval(), load_flat(make(), weights).eval()
        x = torch.from_numpy(server_set.x)
        with torch.no_grad():
            return fedadt_kd_loss(s(x), t(x), torch.from_numpy(server_set.y), 1.0, 3.0).item()

    assert kl_to_teacher(corrected) < kl_to_teacher(client)
    new = strategy.on_arrival(_arrival(client, staleness=3), teacher)
    assert strategy.corrected == 1 and strategy.timestamp == 1
    assert not np.allclose(new, 0.5 * teacher + 0.5 * client)


def test_build_fedadt_takes_a_stratified_server_set():
    labels = np.repeat(np.arange(4), 50)
    rows = server_rows(labels, 0.1, seed=0)
    assert np.bincount(labels[rows]).tolist() == [5, 5, 5, 5]
    resources = StrategyResources(lambda: build_model("mlp", (1, 8, 8), 4), np.zeros((200, 1, 8, 8), np.float32),
                                  labels, seed=0)
    strategy = FedADT.from_config(FedADTConfig(server_fraction=0.02, ramp_arrivals=10), resources)
    assert strategy.summary()["server-set-size"] == 4 and strategy.config.ramp_arrivals == 10


def test_fedadt_without_resources_is_a_clear_error():
    with pytest.raises(ValueError, match="needs the built-in app's model"):
        FedADT.from_config(FedADTConfig(server_fraction=0.1))
    with pytest.raises(ValueError, match="alpha_min=0.7 must be <= alpha_max"):
        FedADTConfig(alpha_min=0.7, alpha_max=0.6)


def test_t_squared_kl_scale_multiplies_the_teacher_term_by_t_squared():
    # Prepare: teacher certain of class 0, student uniform; T = 2
    student, teacher, labels = torch.tensor([[0.0, 0.0]]), torch.tensor([[4.0, 0.0]]), torch.tensor([1])
    p = torch.softmax(teacher / 2.0, dim=1)[0]
    kl = float((p * torch.log(p / 0.5)).sum())  # KL(p || uniform) by hand
    # Execute / Assert: alpha 0.5: 0.5 * s * KL + 0.5 * ln 2 with s = 1 (as printed) or T^2 = 4
    printed = fedadt_kd_loss(student, teacher, labels, alpha=0.5, temperature=2.0, kl_scale="none")
    scaled = fedadt_kd_loss(student, teacher, labels, alpha=0.5, temperature=2.0, kl_scale="t-squared")
    assert printed.item() == pytest.approx(0.5 * kl + 0.5 * np.log(2), rel=1e-5)
    assert scaled.item() == pytest.approx(0.5 * 4.0 * kl + 0.5 * np.log(2), rel=1e-5)


def test_summary_reports_what_the_correction_saw():
    # Prepare: a teacher trained on the server set, a random client, KD weight 1 (teacher term only)
    make, server_set, _, client = _setup()
    teacher_net = make()
    optimizer = torch.optim.SGD(teacher_net.parameters(), lr=0.5)
    x, y = torch.from_numpy(server_set.x), torch.from_numpy(server_set.y)
    for _ in range(200):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(teacher_net(x), y).backward()
        optimizer.step()
    teacher = model_to_flat(teacher_net)
    only_teacher = FedADT(make, server_set, alpha_min=1.0, alpha_max=1.0, kd_lr=1e-6)
    only_labels = FedADT(make, server_set, alpha_min=0.0, alpha_max=0.0, kd_lr=1e-6)
    # Execute
    for strategy in (only_teacher, only_labels):
        strategy.on_arrival(_arrival(client, staleness=4), teacher)
    # Assert: the teacher fits its training set better than the random client; the shares are 1 and 0
    summary = only_teacher.summary()
    assert summary["kd-teacher-accuracy"] > summary["kd-student-accuracy"]
    assert summary["kd-kl-share"] == 1.0 and only_labels.summary()["kd-kl-share"] == 0.0


def test_kl_scale_is_a_run_config_switch():
    from asyncfl.strategies.settings import ConfigError

    assert FedADTConfig.from_run_config({"fedadt.kl-scale": "t-squared"}).kl_scale == "t-squared"
    with pytest.raises(ConfigError, match="none, t-squared"):
        FedADTConfig(kl_scale="T2")
