"""Model zoo sizes and the local training loop."""

import numpy as np
import pytest
import torch

from asyncfl.models.flat import load_flat
from asyncfl.client_app.training import evaluate, train_local
from asyncfl.models import build_model, count_parameters


def test_cnn_is_femnist_size():
    assert 400_000 < count_parameters(build_model("cnn", (1, 28, 28), 10)) < 440_000


def test_resnet18_cifar_variant_size():
    assert count_parameters(build_model("resnet18", (3, 32, 32), 10)) == pytest.approx(11.17e6, rel=0.01)


def test_model_input_checks():
    with pytest.raises(ValueError, match="28x28"):
        build_model("cnn", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="cnn, lenet5, resnet18, mlp"):
        build_model("vit", (1, 28, 28), 10)


def test_batchnorm_option_adds_running_stats():
    model = build_model("cnn", (1, 28, 28), 10, batchnorm=True)
    assert any("running_mean" in k for k in model.state_dict())


def test_statistics_trackers_record_running_statistics_and_change_no_output():
    tracked = build_model("cnn", (1, 28, 28), 10, seed=3, track_statistics=True)
    plain = build_model("cnn", (1, 28, 28), 10, seed=3)
    assert count_parameters(tracked) == count_parameters(plain)  # trackers add buffers, no parameters
    x = torch.randn(16, 1, 28, 28)
    tracked.train()
    out = tracked(x)
    tracker = tracked.features[1]
    first = tracked.features[0](x)
    # recorded as BatchNorm's training pass does: momentum 0.1 from (0, 1), unbiased variance
    assert torch.allclose(tracker.running_mean, 0.1 * first.mean(dim=(0, 2, 3)), atol=1e-6)
    assert torch.allclose(tracker.running_var, 0.9 + 0.1 * first.var(dim=(0, 2, 3), unbiased=True), atol=1e-5)
    assert torch.equal(out, plain(x))  # activations are not normalised
    before = tracker.running_mean.clone()
    tracked.eval()(x)
    assert torch.equal(tracker.running_mean, before)  # evaluation records nothing
    with pytest.raises(ValueError, match="'cnn' only"):
        build_model("lenet5", (1, 28, 28), 10, track_statistics=True)
    with pytest.raises(ValueError, match="not both"):
        build_model("cnn", (1, 28, 28), 10, batchnorm=True, track_statistics=True)


def _toy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 1, 8, 8)).astype(np.float32)
    y = (x.reshape(64, -1)[:, 0] > 0).astype(np.int64)
    return x, y


def test_training_reduces_loss_and_is_seeded():
    x, y = _toy()
    before = evaluate(build_model("mlp", (1, 8, 8), 2, seed=0), x, y)[0]
    model_a, model_b = build_model("mlp", (1, 8, 8), 2, seed=0), build_model("mlp", (1, 8, 8), 2, seed=0)
    train_local(model_a, x, y, steps=30, epochs=0, batch_size=16, optimizer="adam", lr=0.01, seed=5)
    train_local(model_b, x, y, steps=30, epochs=0, batch_size=16, optimizer="adam", lr=0.01, seed=5)
    assert evaluate(model_a, x, y)[0] < before
    for a, b in zip(model_a.state_dict().values(), model_b.state_dict().values()):
        assert torch.equal(a, b)


def test_empty_partition_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        train_local(build_model("mlp", (1, 8, 8), 2), np.zeros((0, 1, 8, 8), np.float32), np.zeros(0, np.int64),
                    steps=1, epochs=0, batch_size=4, optimizer="sgd", lr=0.1)


def test_central_evaluator_loads_batchnorm_models_from_flat_vectors():
    from asyncfl.server_app.codec import ModelCodec
    from asyncfl.server_app.evaluation import CentralEvaluator, state_as_numpy

    model = build_model("cnn", (1, 28, 28), 10, batchnorm=True, seed=0)
    state = state_as_numpy(model)
    codec = ModelCodec.from_state(state)
    x = np.zeros((4, 1, 28, 28), np.float32)
    evaluator = CentralEvaluator(model, x, np.zeros(4, np.int64), batch_size=2, num_classes=10)
    loss, accuracy, per_class = evaluator(codec.flatten(list(state.values())))
    assert np.isfinite(loss) and 0.0 <= accuracy <= 1.0
    assert per_class[0] == accuracy and all(np.isnan(per_class[1:]))  # only class 0 is present
    record = codec.to_record(codec.flatten(list(state.values())))
    model.load_state_dict(record.to_torch_state_dict())  # 0-d num_batches_tracked survives the round trip


def test_per_class_accuracy_is_hand_countable():
    from asyncfl.client_app.training import evaluate_per_class

    class Fixed(torch.nn.Module):  # predicts class 1 for every input
        def forward(self, x):
            out = torch.zeros(len(x), 3)
            out[:, 1] = 1.0
            return out

    y = np.array([0, 1, 1, 2, 1], np.int64)
    _, accuracy, per_class = evaluate_per_class(Fixed(), np.zeros((5, 1), np.float32), y, 3, batch_size=2,
                                                device=torch.device("cpu"))
    assert accuracy == 3 / 5
    assert per_class == [0.0, 1.0, 0.0]


def test_max_pool_fast_path_is_bitwise_the_plain_max_pool():
    from asyncfl.models.zoo import MaxPool2x2

    torch.manual_seed(0)
    x = torch.relu(torch.randn(8, 16, 14, 14)).round(decimals=1)  # many ties, as after ReLU
    plain = torch.nn.MaxPool2d(2)
    with torch.no_grad():  # the channels-last path
        assert torch.equal(MaxPool2x2()(x), plain(x))
        assert MaxPool2x2()(x).is_contiguous()
    grads = []
    for pool in (MaxPool2x2(), plain):
        leaf = x.clone().requires_grad_(True)
        pool(leaf).mul(torch.arange(8 * 16 * 7 * 7, dtype=torch.float32).view(8, 16, 7, 7)).sum().backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])


def test_load_flat_clamps_negative_batchnorm_variances():
    # A candidate built from stale deltas may hold a negative running variance; eval-mode
    # BatchNorm would then output NaN (seen in FedEcho's distillation of a BN model).
    model = torch.nn.BatchNorm1d(2)
    flat = np.array([1, 1, 0, 0, 0, 0, 0.5, -0.25, 3], dtype=np.float32)  # weight, bias, mean, var, count
    load_flat(model, flat)
    assert model.running_var.tolist() == [0.5, 0.0]
    assert int(model.num_batches_tracked) == 3
    assert torch.isfinite(model.eval()(torch.ones(4, 2))).all()


@pytest.mark.parametrize("name", ["cnn", "lenet5"])
def test_chunked_forward_matches_one_pass(name):
    from asyncfl.models.inference import chunked_forward

    model = build_model(name, (1, 28, 28), 10, batchnorm=name == "cnn", seed=0).eval()
    inputs = torch.randn(150, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(inputs)
    for size in (1, 64, 150, 1000):
        chunked = chunked_forward(model, inputs, size)
        assert chunked.shape == (150, 10) and not chunked.requires_grad
        torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
    assert not model.training  # the caller's mode is kept
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        chunked_forward(model, inputs, 0)


def test_evaluation_does_not_depend_on_batch_size():
    model = build_model("cnn", (1, 28, 28), 10, seed=0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((130, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 130)
    loss_a, acc_a = evaluate(model, x, y, batch_size=500)
    loss_b, acc_b = evaluate(model, x, y)  # the cache-friendly default
    assert acc_a == acc_b and loss_a == pytest.approx(loss_b, rel=1e-6)
