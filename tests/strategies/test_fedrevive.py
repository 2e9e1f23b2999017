"""FedRevive: teacher weights, KD pool, proxies, synthesis losses by hand, warm-up equivalence with
AFL-DW, distillation toward the teachers, DD-FedRevive, config."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from asyncfl.config import ConfigError, parse_run_config
from asyncfl.data.holdout import holdout_rows
from asyncfl.models import build_model
from asyncfl.models.flat import load_flat, model_to_flat, parameter_mask
from asyncfl.strategies import AFLDW, Arrival, StrategyResources
from asyncfl.strategies.fedrevive import (DDFedRevive, FedRevive, FedReviveConfig, multi_teacher_kd_loss,
                                          multi_teacher_kd_surrogate)
from asyncfl.strategies.pace import paced_server_lr
from asyncfl.strategies.revive.generator import Generator
from asyncfl.strategies.revive.mixing import MixingTally
from asyncfl.strategies.revive.pool import KDPool
from asyncfl.strategies.revive.proxies import ClassProportionProxies, teacher_class_weights
from asyncfl.strategies.revive.synthesis import BatchNormStatistics, SynthesisConfig, synthesis_loss, synthesize
from tests.test_config import defaults

SHAPE = (1, 8, 8)


def test_teacher_class_weights_normalise_each_class_over_the_buffer():
    weights = teacher_class_weights([np.array([0.5, 0.5]), np.array([0.25, 0.75])])
    assert np.allclose(weights, [[2 / 3, 0.4], [1 / 3, 0.6]])
    assert np.allclose(weights.sum(axis=0), 1.0)


def test_kd_pool_is_fifo_and_samples_by_class_proportions():
    pool = KDPool(capacity=5)
    pool.add(torch.arange(3.0).view(3, 1), torch.tensor([0, 1, 1]))
    pool.add(torch.arange(3.0, 6.0).view(3, 1), torch.tensor([2, 1, 0]))
    assert len(pool) == 5 and pool.x.ravel().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]  # the oldest left
    rng = np.random.default_rng(0)
    only_class_1 = pool.sample(np.array([0.0, 1.0, 0.0]), 20, rng)
    assert set(only_class_1.ravel().tolist()) <= {1.0, 2.0, 4.0}
    # A class the pool lacks is skipped: all mass on class 3 falls back to uniform over present labels.
    assert pool.sample(np.array([0.0, 0.0, 0.0, 1.0]), 10, rng).shape == (10, 1)


class Biased(nn.Module):
    """Logits = bias only: a model that always predicts the same distribution."""

    def __init__(self, bias):
        super().__init__()
        self.bias = nn.Parameter(torch.tensor(bias, dtype=torch.float32))

    def forward(self, x):
        return self.bias.expand(x.shape[0], -1)


def test_proxy_is_the_mean_probe_softmax_of_the_first_t_est_uploads():
    proxies = ClassProportionProxies(3, SHAPE, t_est=2, t_probe=1.0, probe_size=8)
    proxies.observe(7, Biased([math.log(2.0), 0.0, 0.0]))  # softmax (0.5, 0.25, 0.25)
    proxies.observe(7, Biased([0.0, 0.0, 0.0]))  # (1/3, 1/3, 1/3)
    proxies.observe(7, Biased([0.0, 0.0, 50.0]))  # third upload: ignored
    assert np.allclose(proxies.proportions(7), [(0.5 + 1 / 3) / 2, (0.25 + 1 / 3) / 2, (0.25 + 1 / 3) / 2])
    assert np.allclose(proxies.proportions(99), [1 / 3] * 3)  # never seen: uniform


def test_multi_teacher_kd_loss_by_hand():
    student = [torch.zeros(1, 2)]
    teacher = [torch.tensor([[math.log(3.0), 0.0]])]  # (0.75, 0.25) vs (0.5, 0.5)
    expected = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert multi_teacher_kd_loss(student, teacher, 1.0).item() == pytest.approx(expected, rel=1e-5)
    assert multi_teacher_kd_loss(teacher + teacher, teacher + teacher, 1.0).item() == pytest.approx(0.0, abs=1e-7)


def test_batchnorm_statistics_term_by_hand():
    bn = nn.BatchNorm2d(4).eval()  # running mean 0, running var 1
    stats = BatchNormStatistics(nn.Sequential(bn))
    bn(torch.full((2, 4, 3, 3), 0.5))
    # batch mean 0.5, var 0 per channel: ||0.5 * 1_4|| + ||0 - 1_4|| = 0.5 * 2 + 2
    assert stats.take().item() == pytest.approx(3.0)
    stats.remove()


def test_adversarial_term_counts_only_where_teacher_and_student_agree():
    student = Biased([2.0, 0.0])
    agreeing, disagreeing = Biased([5.0, 0.0]), Biased([0.0, 5.0])
    labels = torch.tensor([0, 1])
    x = torch.zeros(2, *SHAPE)
    only_adv = SynthesisConfig(alpha_target=0.0, alpha_feature=0.0, alpha_adv=1.0)
    w = torch.tensor([[1.0, 1.0]])
    stats = [BatchNormStatistics(nn.Sequential())]
    loss_agree = synthesis_loss(x, labels, [agreeing], stats, student, w, only_adv).item()
    p_t, p_s = torch.softmax(torch.tensor([5.0, 0.0]), 0), torch.softmax(torch.tensor([2.0, 0.0]), 0)
    assert loss_agree == pytest.approx(-float((p_t * (p_t / p_s).log()).sum()), rel=1e-5)
    assert synthesis_loss(x, labels, [disagreeing], stats, student, w, only_adv).item() == 0.0


def test_synthesis_returns_a_batch_shaped_like_the_inputs_and_meta_updates_the_generator():
    generator = Generator(16, 3, (1, 8, 8), base=8)
    before = [p.detach().clone() for p in generator.parameters()]
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    config = SynthesisConfig(batch_size=6, steps=2, meta_lambda=0.5)
    batch, labels, loss = synthesize(generator, [teacher], nn.Sequential(nn.Flatten(), nn.Linear(64, 3)),
                                     torch.ones(1, 3), 3, config, torch.Generator().manual_seed(0))
    assert batch.shape == (6, 1, 8, 8) and labels.shape == (6,) and math.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, generator.parameters()))


def _mlp():
    return build_model("mlp", SHAPE, 3)


def test_a_fedrevive_subclass_whose_config_adds_a_knob_is_built_with_fedrevive_s_knobs_passed_on():
    from dataclasses import dataclass

    from asyncfl.strategies.settings import knob

    @dataclass(frozen=True)
    class SlowerConfig(FedReviveConfig):
        slowdown: float = knob(2.0, above=0)

    class Slower(FedRevive):
        config_class = SlowerConfig

        def __init__(self, *args, slowdown: float = 2.0, **knobs) -> None:
            super().__init__(*args, **knobs)
            self.config = SlowerConfig(**{**self.config.keywords(), "slowdown": slowdown})

    revive = Slower(_mlp, 3, SHAPE, slowdown=3.0, kd_steps=4)
    assert (revive.config.slowdown, revive.config.kd_steps, revive.config.beta) == (3.0, 4, "cosine")


def _arrival(client, weights, base, staleness):
    return Arrival(client, 0, staleness, weights, base, 10, 0.1, 0.0)


def test_before_kd_start_fedrevive_is_afl_dw():
    base = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    client = model_to_flat(build_model("mlp", SHAPE, 3, seed=2))
    revive = FedRevive(_mlp, 3, SHAPE, server_lr=0.3, max_staleness=10.0, synthesis_start=100, kd_start=100)
    afl = AFLDW(server_lr=0.3, beta="cosine", max_staleness=10.0)
    for tau in (0, 3, 12):  # bitwise: runs of one seed must not part before KD starts
        assert np.array_equal(revive.on_arrival(_arrival(0, client, base, tau), base),
                              afl.on_arrival(_arrival(0, client, base, tau), base))
    assert revive.kd_updates == 0 and revive.synthesis_rounds == 0


@pytest.mark.parametrize("pace", ["measured", "stable"])
def test_the_automatic_step_follows_afl_dws_pace_before_kd_starts(pace):
    # Prepare: two clients that move 10 % of the way to 0 from wherever they start (a weak response,
    # which the measured pace answers with up to twice the stable step), 4 clients, 2 in flight
    revive = FedRevive(_mlp, 3, SHAPE, pace=pace, synthesis_start=100, kd_start=100)
    afl = AFLDW(pace=pace)
    for strategy in (revive, afl):
        strategy.on_start(num_clients=4, concurrency=2)
    start = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    current = start.copy()
    # Execute: each client's consecutive jobs start from different models, so the meter pairs them
    for version in range(12):
        base = start * np.float32(1.0 + 0.1 * version)
        arrival = Arrival(version % 2, version, 1, base - np.float32(0.1) * base, base, 10, 0.1, 0.0)
        new = revive.on_arrival(arrival, current)
        # Assert: bitwise AFL-DW's step with the same pace, so one seed's runs part only where KD acts
        assert np.array_equal(new, afl.on_arrival(arrival, current))
        current = new
    summary = revive.summary()
    assert summary["server-lr"] == afl.summary()["server-lr"]
    stable = AFLDW(pace="stable")
    stable.on_start(num_clients=4, concurrency=2)
    if pace == "measured":
        assert summary["pace-response"] == pytest.approx(0.1, rel=1e-4)
        assert summary["server-lr"] == pytest.approx(paced_server_lr(1, 2, revive.response_meter.bound), abs=1e-6)
        assert summary["pace-bound"] < 2.0 and summary["server-lr"] > stable.server_lr
    else:
        assert "pace-bound" not in summary and summary["server-lr"] == pytest.approx(stable.server_lr, rel=1e-6)


def test_distillation_moves_the_student_toward_the_buffered_teachers():
    base = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    teachers = [model_to_flat(build_model("mlp", SHAPE, 3, seed=10 + i)) for i in range(3)]
    x = np.random.default_rng(0).normal(size=(60, *SHAPE)).astype(np.float32)
    revive = DDFedRevive(_mlp, 3, SHAPE, (x, np.arange(60) % 3), lambda client, n: np.ones(3), kd_steps=40,
                         kd_lr=0.01, teacher_buffer_size=3)
    for i, weights in enumerate(teachers):
        revive._buffer_teacher(i, weights)

    def kd_loss(weights):
        student = load_flat(_mlp(), weights).eval()
        inputs = torch.from_numpy(x)
        with torch.no_grad():
            outs = [student(inputs)] * 3
            targets = [load_flat(_mlp(), t).eval()(inputs) for t in teachers]
        return multi_teacher_kd_loss(outs, targets, 1.0).item()

    distilled = base + revive.distil(base)
    assert kd_loss(distilled) < 0.5 * kd_loss(base)


def test_dd_fedrevive_mixes_half_and_half_from_the_first_update():
    base = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    client = model_to_flat(build_model("mlp", SHAPE, 3, seed=2))
    x = np.random.default_rng(0).normal(size=(30, *SHAPE)).astype(np.float32)
    revive = DDFedRevive(_mlp, 3, SHAPE, (x, np.arange(30) % 3), lambda client, n: np.ones(3), seed=4,
                         server_lr=1.0, kd_start=0, kd_steps=2)
    assert revive.beta(0) == 0.5 and revive.beta(500) == 0.5
    new = revive.on_arrival(_arrival(0, client, base, 0), base)
    assert revive.kd_updates == 1 and revive.summary()["variant"] == "dd-fedrevive"
    assert not np.allclose(new, base + 0.5 * (client - base))  # the KD half moved it elsewhere


def test_fedrevive_is_deterministic_for_a_seed():
    base = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    clients = [model_to_flat(build_model("mlp", SHAPE, 3, seed=5 + i)) for i in range(4)]
    knobs = dict(synthesis_start=0, kd_start=1, synthesis_every=2, kd_steps=2, latent_dim=8, synthesis_batch_size=8)
    runs = []
    for _ in range(2):
        revive = FedRevive(_mlp, 3, SHAPE, seed=11, **knobs)
        model = base
        for i, weights in enumerate(clients):
            model = revive.on_arrival(_arrival(i, weights, base, 20), model)
        runs.append(model)
    assert np.array_equal(runs[0], runs[1])
    assert revive.synthesis_rounds == 2 and revive.kd_updates == 3


def test_built_from_run_config_and_bad_settings_are_refused():
    rng = np.random.default_rng(0)
    resources = StrategyResources(lambda: build_model("mlp", (1, 28, 28), 10),
                                  rng.normal(size=(40, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 40), seed=0,
                                  server_holdout=0.1, label_histogram=lambda pid, n: np.ones(10))
    cfg = parse_run_config({**defaults(), "strategy": "fedrevive", "fedrevive.teacher-buffer-size": 3})
    assert isinstance(cfg.strategy_config, FedReviveConfig) and cfg.strategy_config.teacher_buffer_size == 3
    revive = FedRevive.from_config(cfg.strategy_config, resources)
    assert isinstance(revive, FedRevive) and revive.config == cfg.strategy_config and len(revive._teacher_nets) == 3
    dd = parse_run_config({**defaults(), "strategy": "dd-fedrevive", "server-holdout": 0.1})
    dd_revive = DDFedRevive.from_config(dd.strategy_config, resources)
    assert dd_revive.data_driven and len(dd_revive.pool) == len(holdout_rows(resources.y_train, 0.1, 0))
    with pytest.raises(ConfigError, match="server-holdout > 0"):
        parse_run_config({**defaults(), "strategy": "dd-fedrevive"})
    with pytest.raises(ConfigError, match="choose one of"):
        parse_run_config({**defaults(), "strategy": "fedrevive", "fedrevive.beta": "sigmoid"})
    with pytest.raises(ConfigError, match="reptile_step=0.0 must be > 0.*fedrevive.reptile-step"):
        parse_run_config({**defaults(), "strategy": "fedrevive", "fedrevive.reptile-step": 0.0})


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_generator_output_has_the_dataset_shape_and_comes_out_standardised(shape):
    torch.manual_seed(0)
    generator = Generator(16, 10, shape).train()
    out = generator(torch.randn(32, 16), torch.arange(32) % 10)
    assert out.shape == (32, *shape) and torch.isfinite(out).all()
    # The non-affine BatchNorm output: zero mean, unit variance per channel over the batch (like our data).
    assert torch.allclose(out.mean(dim=(0, 2, 3)), torch.zeros(shape[0]), atol=1e-4)
    assert torch.allclose(out.var(dim=(0, 2, 3), unbiased=False), torch.ones(shape[0]), atol=1e-2)
    with pytest.raises(ValueError, match="divisible by 4"):
        Generator(16, 10, (1, 30, 30))


def test_batchnorm_statistics_loss_falls_when_inputs_are_optimised_against_a_fixed_teacher():
    teacher = build_model("cnn", (1, 28, 28), 10, batchnorm=True, seed=0)
    with torch.no_grad():  # running statistics the inputs must learn to match
        for module in teacher.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.fill_(0.5)
                module.running_var.fill_(2.0)
    teacher.eval()
    stats = BatchNormStatistics(teacher)
    inputs = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    optimizer = torch.optim.Adam([inputs], lr=0.1)
    losses = []
    for _ in range(100):
        teacher(inputs)
        loss = stats.take()
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    stats.remove()
    # The first layer's statistics are matched; the deeper ones (behind ReLU and pooling) only partly.
    assert losses[-1] < 0.8 * losses[0] and min(losses[50:]) < min(losses[:50])


def test_proxy_ranks_the_dominant_class_first_for_a_teacher_trained_on_a_skewed_split():
    from asyncfl.client_app.training import train_local
    from asyncfl.data import load_dataset

    data = load_dataset("mnist5k", "", 0.2, 42)
    rng = np.random.default_rng(0)
    dominant = np.flatnonzero(data.y_train == 3)[:300]
    others = rng.choice(np.flatnonzero(data.y_train != 3), 60, replace=False)
    rows = np.concatenate([dominant, others])  # 300 of class 3, 60 of the rest
    teacher = build_model("cnn", data.input_shape, 10, batchnorm=True, seed=0)
    train_local(teacher, data.x_train[rows], data.y_train[rows], steps=60, epochs=0, batch_size=32,
                optimizer="adam", lr=1e-3)
    proxies = ClassProportionProxies(10, data.input_shape, t_est=2, t_probe=1.4, seed=0)
    proxies.observe(7, teacher)
    assert int(np.argmax(proxies.proportions(7))) == 3


def test_kd_update_is_zero_when_every_teacher_is_the_student():
    current = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    x = np.random.default_rng(0).normal(size=(30, *SHAPE)).astype(np.float32)
    revive = DDFedRevive(_mlp, 3, SHAPE, (x, np.arange(30) % 3), lambda client, n: np.ones(3), kd_steps=5,
                         kd_lr=0.01, teacher_buffer_size=4)
    for i in range(4):
        revive._buffer_teacher(i, current)
    assert np.abs(revive.distil(current)).max() < 1e-6


def test_with_beta_zero_fedrevive_is_the_plain_asynchronous_step():
    # beta = 0 (constant family): x + eta_s * Delta, the hybrid rule without its KD half, KD never runs.
    base = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    client = model_to_flat(build_model("mlp", SHAPE, 3, seed=2))
    current = model_to_flat(build_model("mlp", SHAPE, 3, seed=3))
    revive = FedRevive(_mlp, 3, SHAPE, server_lr=0.4, beta="constant", beta_constant=0.0, synthesis_start=0,
                       kd_start=0, synthesis_every=1, kd_steps=2, latent_dim=8)
    for tau in (0, 5, 40):
        new = revive.on_arrival(_arrival(0, client, base, tau), current)
        assert np.allclose(new, current + np.float32(0.4) * (client - base), atol=1e-6)
    assert revive.kd_updates == 0


@pytest.mark.parametrize("family", ["cosine", "linear", "step"])
def test_beta_families_start_at_zero_and_never_decrease(family):
    from asyncfl.strategies.staleness import beta_schedule

    values = [beta_schedule(family, tau, 150.0, 0.5) for tau in range(0, 400)]
    assert values[0] == 0.0 and values[-1] == 1.0
    assert all(b >= a for a, b in zip(values, values[1:]))


def test_kd_surrogate_has_the_gradient_of_the_kl_and_none_at_equal_logits():
    torch.manual_seed(0)
    teachers = [torch.randn(5, 4) * 2 for _ in range(3)]
    for temperature in (1.0, 3.0):
        grads = []
        for loss_fn in (multi_teacher_kd_loss, multi_teacher_kd_surrogate):
            students = [torch.randn(5, 4, generator=torch.Generator().manual_seed(k)).requires_grad_(True)
                        for k in range(3)]
            loss_fn(students, teachers, temperature).backward()
            grads.append(torch.cat([s.grad for s in students]))
        assert torch.allclose(grads[0], grads[1], atol=1e-6)
    equal = [t.clone().requires_grad_(True) for t in teachers]
    multi_teacher_kd_surrogate(equal, teachers, 1.0).backward()
    assert all(torch.count_nonzero(s.grad) == 0 for s in equal)


def _bn_cnn():
    return build_model("cnn", (1, 28, 28), 10, batchnorm=True)


def test_teacher_passes_on_a_background_thread_give_the_same_models():
    base = model_to_flat(build_model("cnn", (1, 28, 28), 10, batchnorm=True, seed=1))
    rng = np.random.default_rng(3)
    clients = [(base + 0.02 * rng.standard_normal(base.size)).astype(np.float32) for _ in range(5)]
    knobs = dict(synthesis_start=0, kd_start=2, synthesis_every=2, kd_steps=3, kd_batch_size=8, latent_dim=8,
                 synthesis_batch_size=16, teacher_buffer_size=3, seed=2)
    runs = []
    for overlap in (False, True):
        revive = FedRevive(_bn_cnn, 10, (1, 28, 28), overlap_teachers=overlap, **knobs)
        model, models = base, []
        for i, weights in enumerate(clients):
            model = revive.on_arrival(_arrival(i, weights, base, 20), model)
            models.append(model)
        runs.append(models)
        assert revive.kd_updates == 3
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_kd_update_is_exactly_zero_when_every_teacher_is_the_student_with_background_teachers():
    current = model_to_flat(build_model("cnn", (1, 28, 28), 10, batchnorm=True, seed=1))
    x = np.random.default_rng(0).normal(size=(40, 1, 28, 28)).astype(np.float32)
    revive = DDFedRevive(_bn_cnn, 10, (1, 28, 28), (x, np.arange(40) % 10), lambda client, n: np.ones(10),
                         kd_steps=3, kd_batch_size=8, teacher_buffer_size=3, overlap_teachers=True)
    for i in range(3):
        revive._buffer_teacher(i, current)
    assert np.abs(revive.distil(current)).max() == 0.0


def test_mixing_tally_reports_beta_shares_and_the_kd_half_by_hand():
    tally = MixingTally(mask=np.array([True, True, False]))  # the third entry (a BatchNorm statistic) is left out
    for beta in (0.0, 0.3, 0.6, 1.0):
        tally.observe_beta(beta)
    delta = np.array([3.0, 4.0, 1e6], dtype=np.float32)  # parameter norm 5
    tally.observe_kd(0.5, delta, np.array([0.3, 0.4, 0.0], dtype=np.float32))  # norm 0.5: share 0.5*0.5/(0.5*5)
    tally.observe_kd(0.9, delta, np.array([0.0, 0.5, 7.0], dtype=np.float32))  # 0.9*0.5/(0.1*5) = 0.9
    tally.observe_kd(1.0, delta, np.array([0.5, 0.0, 0.0], dtype=np.float32))  # beta 1: no client half
    figures = tally.summary()
    assert figures["beta-mean"] == pytest.approx(0.475)
    assert (figures["beta-share-above-0.25"], figures["beta-share-above-0.5"], figures["beta-share-above-0.75"]) \
        == (0.75, 0.5, 0.25)
    assert figures["kd-share-geomean"] == pytest.approx(math.sqrt(0.1 * 0.9), rel=1e-3)
    assert figures["kd-norm-ratio-geomean"] == pytest.approx(0.1, rel=1e-3)
    assert figures["kd-updates-at-beta-1"] == 1


def test_parameter_mask_marks_parameters_and_not_batchnorm_statistics():
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    mask = parameter_mask(net)
    # Linear weight 6 + bias 3, BN weight 3 + bias 3 are parameters; running mean 3, var 3, counter 1 are not
    assert mask.tolist() == [True] * 15 + [False] * 7
    assert mask.size == model_to_flat(net).size


def test_fedrevive_and_afl_dw_summaries_carry_the_beta_figures():
    base = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    client = model_to_flat(build_model("mlp", SHAPE, 3, seed=2))
    revive = FedRevive(_mlp, 3, SHAPE, server_lr=0.3, max_staleness=10.0, kd_start=100)
    afl = AFLDW(server_lr=0.3, max_staleness=10.0)
    for tau in (0, 5, 10):  # 1-cosine over 10: beta 0, 0.5, 1
        revive.on_arrival(_arrival(0, client, base, tau), base)
        afl.on_arrival(_arrival(0, client, base, tau), base)
    for summary in (revive.summary(), afl.summary()):
        assert summary["beta-mean"] == pytest.approx(0.5) and summary["beta-share-above-0.75"] == pytest.approx(1 / 3, abs=1e-4)
    assert "kd-share-geomean" not in revive.summary()  # no KD update yet


def test_synthesis_matches_the_statistics_of_tracker_layers_as_of_batchnorm():
    tracked = build_model("cnn", (1, 28, 28), 10, seed=0, track_statistics=True).eval()
    statistics = BatchNormStatistics(tracked)
    tracked(torch.randn(4, 1, 28, 28))
    assert statistics.active and len(statistics.terms) == 2  # one feature term per tracker


def test_max_staleness_zero_scales_the_cutoff_with_the_jobs_in_flight():
    afl = AFLDW(server_lr=0.3, max_staleness=0.0)
    revive = FedRevive(_mlp, 3, SHAPE, max_staleness=0.0)
    for strategy in (afl, revive):
        strategy.on_start(num_clients=100, concurrency=20)  # tau_max = 1.5 x 20 = 30
    assert afl.beta_of(20) == pytest.approx(0.75) and revive.beta(20) == pytest.approx(0.75)
    assert afl.beta_of(30) == 1.0 and revive.beta(15) == pytest.approx(0.5)
    assert AFLDW(max_staleness=150.0).beta_of(20) == pytest.approx((1 - math.cos(math.pi * 20 / 150)) / 2)


def test_raw_warmup_takes_the_undamped_step_before_synthesis_then_afl_dws():
    # Prepare: the reference server's warm-up for 2 updates (its freeze_rounds), KD far away
    base = model_to_flat(build_model("mlp", SHAPE, 3, seed=1))
    client = model_to_flat(build_model("mlp", SHAPE, 3, seed=2))
    revive = FedRevive(_mlp, 3, SHAPE, server_lr=0.3, max_staleness=10.0, warmup="raw", synthesis_start=2,
                       kd_start=100)
    afl = AFLDW(server_lr=0.3, beta="cosine", max_staleness=10.0)
    # Execute / Assert: updates 1-2 ignore beta(tau=8) (x + 0.3 delta), update 3 is AFL-DW's damped step
    delta = client - base
    for _ in range(2):
        assert np.array_equal(revive.on_arrival(_arrival(0, client, base, 8), base), base + np.float32(0.3) * delta)
    assert np.array_equal(revive.on_arrival(_arrival(0, client, base, 8), base),
                          afl.on_arrival(_arrival(0, client, base, 8), base))
    assert revive.summary()["raw-warmup-updates"] == 2


def test_warmup_is_a_run_config_switch_with_its_choices_named():
    assert FedReviveConfig.from_run_config({**defaults(), "fedrevive.warmup": "raw"}).warmup == "raw"
    with pytest.raises(ConfigError, match="damped, raw"):
        FedReviveConfig.from_run_config({**defaults(), "fedrevive.warmup": "undamped"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal cannot happen")
def test_server_device_cuda_without_a_gpu_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"server_device='cuda' needs a CUDA GPU.*run-config fedrevive.server-device"):
        FedRevive(_mlp, 3, SHAPE, server_device="cuda")
    with pytest.raises(ConfigError, match="choose one of: cpu, cuda"):
        FedRevive(_mlp, 3, SHAPE, server_device="gpu")


def test_kd_pool_keeps_labels_on_the_cpu_and_moves_restored_inputs_to_its_device():
    pool = KDPool(capacity=4, device="meta")  # a device without data: where tensors live is all that is checked
    pool.add(torch.zeros(2, 1), torch.tensor([0, 1]))
    assert pool.x.device.type == "meta" and pool.y.device.type == "cpu"
    pool.x = torch.zeros(2, 1)  # as a checkpoint restores it
    assert pool.sample(np.array([0.5, 0.5]), 3, np.random.default_rng(0)).device.type == "meta"


def _revive_arrivals(device: str, overlap: bool = True):
    base = model_to_flat(build_model("cnn", (1, 28, 28), 10, batchnorm=True, seed=1))
    rng = np.random.default_rng(3)
    clients = [(base + 0.02 * rng.standard_normal(base.size)).astype(np.float32) for _ in range(6)]
    revive = FedRevive(_bn_cnn, 10, (1, 28, 28), synthesis_start=0, kd_start=2, synthesis_every=2, kd_steps=3,
                       kd_batch_size=8, latent_dim=8, synthesis_batch_size=16, teacher_buffer_size=3, seed=2,
                       overlap_teachers=overlap, server_device=device)
    return revive, base, clients


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on a lent device)")
def test_fedrevive_on_a_gpu_makes_the_cpu_updates_up_to_float_order_and_resumes_there():
    models = {}
    for device in ("cpu", "cuda"):
        revive, model, clients = _revive_arrivals(device)
        models[device] = []
        for i, weights in enumerate(clients):
            model = revive.on_arrival(_arrival(i, weights, model, 20), model)
            models[device].append(model)
        assert revive.kd_updates == 4 and revive.synthesis_rounds == 3
    for cpu, gpu in zip(models["cpu"], models["cuda"]):
        np.testing.assert_allclose(gpu, cpu, rtol=0, atol=1e-4)
    # A checkpoint taken on the GPU resumes there and continues as the uninterrupted run.
    revive, model, clients = _revive_arrivals("cuda")
    for i, weights in enumerate(clients[:3]):
        model = revive.on_arrival(_arrival(i, weights, model, 20), model)
    saved = revive.state_dict()
    resumed, _, _ = _revive_arrivals("cuda")
    resumed.load_state_dict(saved)
    assert resumed.pool.x.device.type == "cpu"  # restored on the CPU, moved at first use
    straight, resumed_model = model, model
    for i, weights in enumerate(clients[3:], start=3):
        straight = revive.on_arrival(_arrival(i, weights, straight, 20), straight)
        resumed_model = resumed.on_arrival(_arrival(i, weights, resumed_model, 20), resumed_model)
    np.testing.assert_allclose(resumed_model, straight, rtol=0, atol=1e-5)


def test_label_histograms_by_partition_id_are_refused_in_an_apps_own_loop():
    from flwr.app import Array, ArrayRecord, ConfigRecord

    from tests.fake_grid import FakeGrid

    revive = FedRevive(_mlp, 3, SHAPE, true_proportions=lambda client, n: np.ones(3))
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    with pytest.raises(ConfigError, match="take partition ids"):
        revive.configure_train(1, initial, ConfigRecord({}), FakeGrid(2, lambda node, message: None))
