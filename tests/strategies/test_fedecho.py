"""FedEcho: entropy-weighted loss by hand, the logit bank, FedBuff equivalence without distillation,
and that distillation pulls the global model toward the clients' averaged predictions."""

import math

import numpy as np
import pytest
import torch

from asyncfl.config import ConfigError
from asyncfl.data.holdout import client_pool, holdout_rows
from asyncfl.data.unlabeled import distillation_inputs
from asyncfl.models import build_model
from asyncfl.models.flat import load_flat, model_to_flat
from asyncfl.strategies import Arrival, FedBuff, StrategyResources
from asyncfl.strategies.fedecho import (
    ClientLogitBank,
    FedEcho,
    fedecho_distillation_loss,
    normalised_batch_entropy,
    uncertainty_weight,
)
from tests.test_config import defaults


def test_normalised_entropy_is_one_for_uniform_and_near_zero_for_confident():
    assert normalised_batch_entropy(torch.zeros(4, 10)).item() == pytest.approx(1.0)
    confident = torch.full((3, 10), -50.0)
    confident[:, 2] = 50.0
    assert normalised_batch_entropy(confident).item() == pytest.approx(0.0, abs=1e-6)


def test_alpha_interpolates_between_min_and_max_by_entropy():
    assert uncertainty_weight(torch.zeros(2, 4), 0.2, 0.8) == pytest.approx(0.8)
    # Two classes, p = (0.5, 0.5) for one row and one-hot for the other: H_hat = (ln 2 / ln 2 + 0) / 2 = 0.5.
    logits = torch.tensor([[0.0, 0.0], [60.0, -60.0]])
    assert uncertainty_weight(logits, 0.2, 0.8) == pytest.approx(0.5, abs=1e-6)


def test_distillation_loss_by_hand():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])  # p_t = (0.75, 0.25), argmax 0
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    ce = math.log(2.0)
    loss = fedecho_distillation_loss(student, teacher, alpha=0.3)
    assert loss.item() == pytest.approx(0.3 * kl + 0.7 * ce, rel=1e-5)
    assert fedecho_distillation_loss(teacher, teacher, alpha=1.0).item() == pytest.approx(0.0, abs=1e-7)


def test_logit_bank_keeps_only_each_clients_latest_logits():
    bank = ClientLogitBank()
    bank.store(0, np.full((2, 3), 1.0))
    bank.store(1, np.full((2, 3), 3.0))
    bank.store(0, np.full((2, 3), 5.0))  # replaces client 0's first logits
    assert len(bank) == 2
    assert np.allclose(bank.mean(), 4.0)
    assert np.allclose(bank.mean(np.array([1])), [[4.0, 4.0, 4.0]])
    assert bank.nbytes == 2 * 2 * 3 * 2  # float16


def test_logit_bank_keeps_logits_beyond_float16_and_refuses_non_finite_ones():
    # A client model that diverged locally gave logits of 1.6e9 in a paper-regime run: cast to float16 they
    # became inf, the teacher inf, the distilled model NaN, and the run stopped. Now: kept as float32, exact.
    bank = ClientLogitBank()
    bank.store(0, np.full((2, 3), 2.0, dtype=np.float32))
    assert bank.store(1, np.full((2, 3), 1.6e9, dtype=np.float32))
    assert np.all(np.isfinite(bank.mean())) and np.allclose(bank.mean(), (2.0 + 1.6e9) / 2)
    assert bank.wide == 1 and bank.nbytes == 2 * 3 * 2 + 2 * 3 * 4
    # non-finite logits are refused: client 1 keeps its previous ones, client 2 is not in the teacher
    assert not bank.store(1, np.full((2, 3), np.nan, dtype=np.float32))
    assert not bank.store(2, np.array([[np.inf, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32))
    assert bank.refused == 2 and len(bank) == 2 and np.allclose(bank.mean(), (2.0 + 1.6e9) / 2)
    bank.store(1, np.full((2, 3), 4.0, dtype=np.float32))  # back in range: float16 again, the sum exact
    assert np.allclose(bank.mean(), 3.0) and bank.nbytes == 2 * 2 * 3 * 2


def _mlp_setup():
    make = lambda: build_model("mlp", (1, 8, 8), 3)  # noqa: E731
    unlabeled = np.random.default_rng(0).normal(size=(60, 1, 8, 8)).astype(np.float32)
    global_model = model_to_flat(build_model("mlp", (1, 8, 8), 3, seed=1))
    clients = [model_to_flat(build_model("mlp", (1, 8, 8), 3, seed=10 + i)) for i in range(4)]
    return make, unlabeled, global_model, clients


def _arrival(client, weights, base, staleness=0):
    return Arrival(client, 0, staleness, weights, base, 10, 0.1, 0.0)


def test_without_distillation_steps_fedecho_is_fedbuff():
    make, unlabeled, base, clients = _mlp_setup()
    echo = FedEcho(make, unlabeled, buffer_size=2, server_lr=0.7, distill_steps=0)
    buff = FedBuff(buffer_size=2, server_lr=0.7)
    for i, weights in enumerate(clients):
        a, b = echo.on_arrival(_arrival(i, weights, base), base), buff.on_arrival(_arrival(i, weights, base), base)
        assert (a is None) == (b is None)
        if a is not None:
            assert np.allclose(a, b, atol=1e-6)
    assert echo.aggregations == 2 and len(echo.bank) == 4


def test_distillation_moves_the_global_model_toward_the_averaged_client_predictions():
    make, unlabeled, base, clients = _mlp_setup()
    echo = FedEcho(make, unlabeled, buffer_size=4, server_lr=1.0, distill_steps=30, distill_lr=0.01,
                   alpha_min=1.0, alpha_max=1.0, clip=5.0)
    candidate = base + np.mean([c - base for c in clients], axis=0)
    for i, weights in enumerate(clients[:3]):
        assert echo.on_arrival(_arrival(i, weights, base), base) is None
    new = echo.on_arrival(_arrival(3, clients[3], base), base)
    teacher = torch.from_numpy(echo.bank.mean())

    def kl(weights):
        net = load_flat(make(), weights).eval()
        with torch.no_grad():
            return fedecho_distillation_loss(net(torch.from_numpy(unlabeled)), teacher, 1.0).item()

    assert kl(new) < 0.5 * kl(candidate)
    summary = echo.summary()
    assert summary["mean-alpha"] == pytest.approx(1.0) and summary["logit-clients"] == 4


def test_fedecho_is_deterministic_for_a_seed():
    make, unlabeled, base, clients = _mlp_setup()
    outputs = []
    for _ in range(2):
        echo = FedEcho(make, unlabeled, buffer_size=2, distill_steps=5, distill_batch_size=8, seed=3)
        echo.on_arrival(_arrival(0, clients[0], base), base)
        outputs.append(echo.on_arrival(_arrival(1, clients[1], base), base))
    assert np.array_equal(outputs[0], outputs[1])


def test_digits_are_resized_to_the_clients_input_shape_and_subsampled():
    x_train = np.zeros((5, 1, 28, 28), np.float32)
    inputs = distillation_inputs("digits", x_train, np.zeros(5, np.int64), size=300, seed=0)
    assert inputs.shape == (300, 1, 28, 28) and inputs.dtype == np.float32
    assert abs(float(inputs.mean())) < 0.2  # standardised on its own statistics
    with pytest.raises(ValueError, match="grayscale"):
        distillation_inputs("digits", np.zeros((5, 3, 32, 32), np.float32), np.zeros(5, np.int64), 10, 0)


def test_holdout_rows_are_never_in_any_client_partition():
    labels = np.repeat(np.arange(10), 40)
    held = holdout_rows(labels, 0.1, seed=1)
    pool = client_pool(labels, 0.1, seed=1)
    assert len(held) == 40 and np.intersect1d(held, pool).size == 0
    assert len(held) + len(pool) == len(labels)
    x = np.arange(len(labels), dtype=np.float32).reshape(-1, 1, 1, 1)
    inputs = distillation_inputs("holdout", x, labels, size=1000, seed=1, holdout_fraction=0.1)
    assert set(inputs.ravel().astype(int)) == set(held)


def test_the_built_in_app_makes_fedecho_from_its_run_config_section():
    from asyncfl.config import parse_run_config

    cfg = parse_run_config({**defaults(), "strategy": "fedecho", "fedecho.distill-size": 50})
    rng = np.random.default_rng(0)
    resources = StrategyResources(lambda: build_model("mlp", (1, 28, 28), 10), rng.normal(size=(20, 1, 28, 28)).astype(np.float32),
                                  rng.integers(0, 10, 20), seed=0)
    strategy = FedEcho.from_config(cfg.strategy_config, resources)
    assert isinstance(strategy, FedEcho) and strategy.unlabeled.shape == (50, 1, 28, 28)
    assert strategy.summary()["distill-set"] == "digits"


def test_mnist5k_serves_as_a_cross_dataset_distillation_set_for_fashion_mnist_clients():
    from asyncfl.data.unlabeled import distill_set_problem, distillation_inputs

    assert distill_set_problem("mnist5k", "fashion-mnist", 0.0) is None
    clients = np.zeros((3, 1, 28, 28), np.float32)
    inputs = distillation_inputs("mnist5k", clients, np.zeros(3, np.int64), 100, seed=0)
    again = distillation_inputs("mnist5k", clients, np.zeros(3, np.int64), 100, seed=0)
    assert inputs.shape == (100, 1, 28, 28) and np.array_equal(inputs, again)
    assert abs(float(inputs.mean())) < 0.3  # standardised on mnist5k's own statistics


@pytest.mark.parametrize("overrides, message", [
    ({"fedecho.distill-set": "holdout"}, "server-holdout > 0"),
    ({"fedecho.distill-set": "digits", "dataset": "cifar10"}, "grayscale"),
    ({"fedecho.distill-set": "cifar10", "dataset": "cifar10"}, "another 3-channel"),
    ({"fedecho.distill-set": "mnist5k"}, "not 'mnist5k'"),
    ({"fedecho.alpha-min": 0.9, "fedecho.alpha-max": 0.1}, "alpha-min"),
    ({"fedecho.distill-set": "stl10"}, "choose one of"),
])
def test_bad_fedecho_settings_are_refused_with_the_valid_choices(overrides, message):
    from asyncfl.config import parse_run_config

    with pytest.raises(ConfigError, match=message):
        parse_run_config({**defaults(), "strategy": "fedecho", **overrides})


def test_client_logits_are_the_client_models_outputs_on_all_of_u():
    make = lambda: build_model("cnn", (1, 28, 28), 10, batchnorm=True)  # noqa: E731
    unlabeled = np.random.default_rng(0).standard_normal((200, 1, 28, 28)).astype(np.float32)
    echo = FedEcho(make, unlabeled)
    client = build_model("cnn", (1, 28, 28), 10, batchnorm=True, seed=5).eval()
    with torch.no_grad():
        expected = client(torch.from_numpy(unlabeled)).numpy()
    logits = echo.client_logits(model_to_flat(client))
    assert logits.shape == (200, 10)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)


def _cnn_uploads():
    """A CNN builder, 100 unlabeled inputs, a base model and 9 uploads from 4 clients near it."""
    make = lambda: build_model("cnn", (1, 28, 28), 10)  # noqa: E731
    unlabeled = np.random.default_rng(1).standard_normal((100, 1, 28, 28)).astype(np.float32)
    base = model_to_flat(build_model("cnn", (1, 28, 28), 10, seed=0))
    rng = np.random.default_rng(2)
    uploads = [(i % 4, (base + 0.01 * rng.standard_normal(base.size)).astype(np.float32)) for i in range(9)]
    return make, unlabeled, base, uploads


def test_logits_on_a_background_thread_give_the_same_models_and_bank():
    make, unlabeled, base, uploads = _cnn_uploads()
    runs = []
    for overlap in (False, True):
        echo = FedEcho(make, unlabeled, buffer_size=3, distill_steps=4, distill_batch_size=16, distill_lr=1e-3,
                       overlap_logits=overlap, seed=5)
        current, models = base, []
        for client, weights in uploads:
            new = echo.on_arrival(_arrival(client, weights, base), current)
            if new is not None:
                current = new
                models.append(new)
        runs.append((models, echo.bank.mean(), echo.summary()))
    (models_a, bank_a, summary_a), (models_b, bank_b, summary_b) = runs
    assert len(models_a) == len(models_b) == 3
    for a, b in zip(models_a, models_b):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(bank_a, bank_b)
    assert summary_a == summary_b and summary_a["logit-clients"] == 4


def test_a_failed_background_logit_pass_is_raised_at_the_next_aggregation():
    make, unlabeled, base, clients = _mlp_setup()
    echo = FedEcho(make, unlabeled, buffer_size=2, distill_steps=1)

    def failing_pass(weights):
        raise RuntimeError("logit pass failed")

    echo.client_logits = failing_pass
    assert echo.on_arrival(_arrival(0, clients[0], base), base) is None  # returns before the pass has run
    with pytest.raises(RuntimeError, match="logit pass failed"):
        echo.on_arrival(_arrival(1, clients[1], base), base)


def test_each_aggregation_scores_the_logit_ensemble_against_the_model_it_teaches():
    # Prepare: U of 30 labeled inputs; two clients whose models differ from the global model
    from asyncfl.strategies.fedecho import FedEcho

    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(30, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 3, 30)
    make = lambda: build_model("mlp", (1, 8, 8), 3)  # noqa: E731
    current = model_to_flat(build_model("mlp", (1, 8, 8), 3, seed=1))
    strategy = FedEcho(make, inputs, buffer_size=2, server_lr=1.0, distill_steps=0, overlap_logits=False,
                       distill_labels=labels)
    clients = [model_to_flat(build_model("mlp", (1, 8, 8), 3, seed=s)) for s in (2, 3)]
    # Execute: two arrivals fill the buffer once
    new = None
    for index, weights in enumerate(clients):
        new = strategy.on_arrival(Arrival(index, 0, 0, weights, current, 10, 0.1, 0.0), current)
    # Assert: the figures by hand, from the same networks
    def predictions(flat):
        net = make()
        load_flat(net, flat)
        with torch.no_grad():
            return net.eval()(torch.from_numpy(inputs))

    ensemble = torch.stack([predictions(c).half().float() for c in clients]).mean(0).argmax(1).numpy()
    own = predictions(new).argmax(1).numpy()
    summary = strategy.summary()
    assert summary["teacher-agreement"] == pytest.approx(float((ensemble == own).mean()), abs=1e-4)
    assert summary["teacher-accuracy-on-u"] == pytest.approx(float((ensemble == labels).mean()), abs=1e-4)
    assert summary["global-accuracy-on-u"] == pytest.approx(float((own == labels).mean()), abs=1e-4)
    assert summary["teacher-better-share"] == float((ensemble == labels).mean() > (own == labels).mean())


def _one_aggregation(seed: int, **knobs):
    """Two client models arrive at FedEcho (buffer 2, server lr 1) on 30 random inputs: (global model before,
    after, the summary)."""
    from asyncfl.strategies.fedecho import FedEcho

    inputs = np.random.default_rng(seed).normal(size=(30, 1, 8, 8)).astype(np.float32)
    current = model_to_flat(build_model("mlp", (1, 8, 8), 3, seed=1))
    clients = [model_to_flat(build_model("mlp", (1, 8, 8), 3, seed=s)) for s in (2, 3)]
    strategy = FedEcho(lambda: build_model("mlp", (1, 8, 8), 3), inputs, buffer_size=2, server_lr=1.0,
                       overlap_logits=False, **knobs)
    new = None
    for index, weights in enumerate(clients):
        new = strategy.on_arrival(Arrival(index, 0, 0, weights, current, 10, 0.1, 0.0), current)
    return current, new, strategy.summary()


def test_distill_move_ratio_is_the_distillations_change_over_the_buffered_step():
    # Prepare / execute: the same arrivals into FedEcho with 3 distillation steps and into its twin without any
    current, distilled, summary = _one_aggregation(1, distill_steps=3, distill_lr=1e-2)
    _, plain, plain_summary = _one_aggregation(1, distill_steps=0)
    # Assert: the ratio by hand from the two models; the twin without distillation reports none
    expected = np.linalg.norm(distilled - plain) / np.linalg.norm(plain - current)
    assert expected > 0
    assert summary["distill-move-ratio"] == pytest.approx(expected, rel=1e-4)
    assert "distill-move-ratio" not in plain_summary


def test_holdout_distillation_labels_are_the_rows_of_its_inputs():
    from asyncfl.data.unlabeled import distillation_labels

    x = np.arange(200, dtype=np.float32).reshape(200, 1, 1, 1)
    labels = np.arange(200) % 4
    inputs = distillation_inputs("holdout", x, labels, size=10, seed=3, holdout_fraction=0.2)
    ours = distillation_labels("holdout", labels, size=10, seed=3, holdout_fraction=0.2)
    assert np.array_equal(labels[inputs[:, 0, 0, 0].astype(int)], ours)
    assert distillation_labels("mnist5k", labels, size=10, seed=3) is None


def test_distill_move_scales_the_next_distillation_step_towards_its_fraction_of_the_buffered_step():
    # Prepare: one aggregation at a fixed step gives the ratio that step makes
    fixed = _one_aggregation(2, distill_steps=3, distill_lr=1e-3)[2]
    ratio = fixed["distill-move-ratio"]
    # Execute: targets a little under, far under and far over that ratio
    near, low, high = (_one_aggregation(2, distill_steps=3, distill_lr=1e-3, distill_move=ratio * f)[2]["distill-lr"]
                       for f in (0.5, 0.01, 100.0))
    # Assert: the next eta_d is scaled by target / ratio, at most 4x either way; the fixed step stays
    assert fixed["distill-lr"] == 1e-3
    assert near == pytest.approx(0.5e-3, rel=1e-3)
    assert low == pytest.approx(0.25e-3, rel=1e-3)
    assert high == pytest.approx(4e-3, rel=1e-3)


def test_distill_move_without_a_distillation_is_refused():
    from asyncfl.strategies.fedecho import FedEchoConfig

    with pytest.raises(ValueError, match="distill_move.*distill_steps = 0 turns the distillation off"):
        FedEchoConfig(distill_steps=0, distill_move=0.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal cannot happen")
def test_fedecho_server_device_cuda_without_a_gpu_is_refused_naming_the_key():
    make, unlabeled, _, _ = _mlp_setup()
    with pytest.raises(ConfigError, match=r"server_device='cuda' needs a CUDA GPU.*run-config fedecho.server-device"):
        FedEcho(make, unlabeled, server_device="cuda")


def _echo_models(device: str, uploads, base, make, unlabeled, state=None, start=0, current=None):
    echo = FedEcho(make, unlabeled, buffer_size=3, distill_steps=4, distill_batch_size=16, distill_lr=1e-3,
                   distill_move=0.5, seed=5, server_device=device)
    if state is not None:
        echo.load_state_dict(state)
    current, models = (base if current is None else current), []
    for client, weights in uploads[start:]:
        new = echo.on_arrival(_arrival(client, weights, base), current)
        if new is not None:
            current = new
            models.append(new)
    return echo, models


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on a lent device)")
def test_fedecho_on_a_gpu_makes_the_cpu_updates_up_to_float_order_and_resumes_there():
    make, unlabeled, base, uploads = _cnn_uploads()
    _, on_cpu = _echo_models("cpu", uploads, base, make, unlabeled)
    gpu, on_gpu = _echo_models("cuda", uploads, base, make, unlabeled)
    assert len(on_cpu) == len(on_gpu) == 3 and gpu.summary()["server-device"] == "cuda"
    for a, b in zip(on_cpu, on_gpu):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)
    # a checkpoint after the first aggregation (its Adam moments restored on the CPU) resumes on the GPU
    first, _ = _echo_models("cuda", uploads[:3], base, make, unlabeled)
    _, resumed = _echo_models("cuda", uploads, base, make, unlabeled, state=first.state_dict(), start=3,
                              current=on_gpu[0])
    for a, b in zip(on_gpu[1:], resumed):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
