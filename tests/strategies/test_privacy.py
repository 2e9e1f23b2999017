"""Differential privacy for asynchronous strategies: clipping, noise at each step, per-owner accounting, and
noise that nothing in the run folder reproduces."""

import json
import logging
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from asyncfl import DifferentialPrivacyServerSideFixedClipping as DP
from asyncfl import FedAsync, FedAvg, FedBuff
from asyncfl.errors import ConfigError
from asyncfl.server_app import checkpoint
from asyncfl.strategies.accounting import FLOWER_ACCOUNTANT, flower_epsilon
from asyncfl.strategies.privacy import DifferentialPrivacyConfig, os_entropy_normal
from asyncfl.strategies.arrival import Arrival
from tests.fake_grid import FakeGrid, trained_reply

def arrival(client, delta, tau=0) -> Arrival:
    base = np.zeros(len(delta), np.float32)
    return Arrival(client, 0, tau, base + np.asarray(delta, np.float32), base, 1, 0.0, 0.0)


def test_updates_are_clipped_and_each_step_gets_noise_of_sigma_c_times_the_step_coefficient():
    inner = FedBuff(buffer_size=2, server_lr=1.0)
    dp = DP(inner, noise_multiplier=0.5, clipping_norm=1.0)
    dp.on_start(4, concurrency=2)
    current = np.zeros(20000, np.float32)
    big = np.zeros(20000, np.float32)
    big[0] = 10.0
    assert dp.clip(arrival(0, big)).delta[0] == pytest.approx(1.0)
    assert dp.on_arrival(arrival(0, big), current) is None
    new = dp.on_arrival(arrival(0, big), current)  # the same client twice in the buffer: k = 2
    noise = new.copy()
    noise[0] -= 1.0  # (1 + 1) / 2: the clipped updates' mean
    assert noise.std() == pytest.approx(0.5 * 1.0 * 0.5, rel=0.03)  # sigma C eta/B
    assert dp.ledger.rho == {"client-index:0": 4.0}
    assert dp.summary()["dp-epsilon"] == pytest.approx(flower_epsilon(4.0, 0.5, 1e-5), abs=1e-6)


def test_fedasync_steps_are_noised_at_their_mixing_weight():
    dp = DP(FedAsync(alpha=0.5, staleness="constant"), noise_multiplier=2.0, clipping_norm=0.1)
    dp.on_start(2)
    new = dp.on_arrival(arrival(1, np.zeros(20000)), np.zeros(20000, np.float32))
    assert new.std() == pytest.approx(2.0 * 0.1 * 0.5, rel=0.03)
    assert dp.ledger.rho == {"client-index:1": 1.0}


@pytest.mark.parametrize("strategy, says", [
    (lambda: FedAvg(), "not a weighted sum"),
    (lambda: FedBuff(), "pace='measured'"),
    (lambda: FedBuff(server_lr=1.0, aggregation="median"), "order statistics"),
])
def test_strategies_whose_step_noise_cannot_cover_are_refused(strategy, says):
    with pytest.raises(ConfigError, match=says):
        DP(strategy(), noise_multiplier=1.0, clipping_norm=1.0)


def test_the_adaptive_bound_cannot_be_asked_for_under_dp():
    dp = DP(FedBuff(server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0)
    with pytest.raises(ConfigError, match="update_norm_bound=3"):
        dp.start(FakeGrid(2, None), ArrayRecord({"w": Array(np.zeros(2, np.float32))}), update_norm_bound=3.0)


def _learner(node, message):
    w = message.content.array_records["arrays"]["w"].numpy()
    return trained_reply(message, ArrayRecord({"w": Array(w + np.float32(0.2) * (np.float32(1.0) - w))}))


def _run(insecure_noise_seed=None, noise_multiplier=1.0, **options):
    dp = DP(FedBuff(buffer_size=4, server_lr=1.0), noise_multiplier=noise_multiplier, clipping_norm=0.5,
            insecure_noise_seed=insecure_noise_seed)
    grid = FakeGrid(8, _learner)
    result = dp.start(grid, ArrayRecord({"w": Array(np.zeros(64, np.float32))}), num_rounds=0,
                      train_config=ConfigRecord({}), clock="virtual", delay_model="fedrevive-default", seed=1,
                      max_arrivals=80, concurrency=4, **options)
    result.grid = grid
    return result


def test_a_private_run_learns_reports_epsilon_and_where_its_noise_comes_from():
    result = _run()
    summary = result.summary
    assert summary["dp-releases"] == summary["server-versions"] == 20
    assert summary["dp-epsilon"] > 0 and "update-norm-bound" not in summary  # the fixed clip replaces it
    assert summary["dp-epsilon"] == pytest.approx(flower_epsilon(summary["dp-most-participations"], 1.0, 1e-5),
                                                  abs=1e-6)
    assert summary["dp-accountant"] == FLOWER_ACCOUNTANT  # Flower's RdpAccountant converted it (tests/strategies/test_accounting.py)
    assert summary["dp-noise"] == "os-entropy" and "dp-insecure-noise-seed" not in summary
    assert summary["dp-ledger-key"] == "partition-id"  # the engine names each client's owner (bind_owners)
    w = result.arrays["w"].numpy()
    assert np.linalg.norm(w - 1.0) < 0.6 * np.linalg.norm(np.ones(64))  # it moved toward the target despite noise


def test_without_noise_a_run_reaches_its_stop_and_says_epsilon_is_infinite(caplog):
    with caplog.at_level(logging.WARNING, logger="asyncfl.privacy"):
        result = _run(noise_multiplier=0.0)  # Flower's wrappers take 0 too
    assert result.summary["dp-releases"] == 20 and math.isinf(result.summary["dp-epsilon"])
    assert "no release is private" in caplog.text


def test_the_same_seeds_give_other_noise_unless_the_insecure_seed_is_asked_for(caplog):
    private = [_run().arrays["w"].numpy() for _ in range(2)]
    assert not np.array_equal(*private)  # same engine seed, same replies: only the noise differs
    with caplog.at_level(logging.WARNING, logger="asyncfl.privacy"):
        seeded = [_run(insecure_noise_seed=2) for _ in range(2)]
    assert np.array_equal(seeded[0].arrays["w"].numpy(), seeded[1].arrays["w"].numpy())
    assert seeded[0].summary["dp-noise"] == "reproducible (insecure-noise-seed): not private"
    assert seeded[0].summary["dp-insecure-noise-seed"] == 2
    assert "NOT private" in caplog.text


def test_the_old_seed_keyword_is_refused_naming_the_new_one():
    from asyncfl import DifferentialPrivacyClientSideFixedClipping

    for cls in (DP, DifferentialPrivacyClientSideFixedClipping):
        with pytest.raises(ConfigError, match="insecure_noise_seed") as refused:
            cls(FedBuff(server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0, seed=0)
        assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="dp.insecure-noise-seed"):
        DifferentialPrivacyConfig.from_run_config({"dp.seed": 0})
    assert DifferentialPrivacyConfig.from_run_config({"dp.insecure-noise-seed": 3}).insecure_noise_seed == 3
    with pytest.raises(ConfigError, match="insecure_noise_seed"):
        DP(FedBuff(server_lr=1.0), insecure_noise_seed=-1)


def test_os_entropy_normals_are_standard_normal():
    z = os_entropy_normal(400_001)
    assert z.shape == (400_001,) and z.dtype == np.float64
    # each bound is > 6 standard errors away from failing by chance
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    assert abs(np.mean(np.abs(z) > 1.96) - 0.05) < 0.003 and abs(np.mean(z ** 4) - 3.0) < 0.1
    assert np.max(np.abs(z)) <= math.sqrt(-2.0 * math.log(2.0 ** -53))


# ------------------------------------------------------------------ an attacker with the run folder
class _Unnoised(FedBuff):
    """FedBuff keeping each step it makes before the wrapper noises it: the test's ground truth."""

    def __init__(self, **keywords):
        super().__init__(**keywords)
        self.steps = []

    def on_arrival(self, arrival, current):
        new = super().on_arrival(arrival, current)
        if new is not None:
            self.steps.append(new.copy())
        return new


class _Released(DP):
    """The wrapper keeping each model it releases."""

    def __init__(self, *args, **keywords):
        super().__init__(*args, **keywords)
        self.released = []

    def on_arrival(self, arrival, current):
        new = super().on_arrival(arrival, current)
        if new is not None:
            self.released.append(new.copy())
        return new


def _run_with_folder(folder, insecure_noise_seed):
    inner = _Unnoised(buffer_size=4, server_lr=1.0)
    dp = _Released(inner, noise_multiplier=1.0, clipping_norm=0.5, insecure_noise_seed=insecure_noise_seed)
    dp.start(FakeGrid(8, _learner), ArrayRecord({"w": Array(np.zeros(256, np.float32))}), num_rounds=0,
             train_config=ConfigRecord({}), clock="virtual", delay_model="fedrevive-default", seed=0, max_arrivals=40,
             concurrency=4, output_dir=str(folder.parent), run_name=folder.name, checkpoint_every=2,
             checkpoint_keep=5)
    return [released - step for released, step in zip(dp.released, inner.steps)]


def _walk(tree):
    """Every value in a JSON-like tree."""
    yield tree
    children = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    for child in children:
        yield from _walk(child)


def _seed_like(trees) -> set[int]:
    found = {value for tree in trees for value in _walk(tree)
             if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 64}
    return found | set(range(17)) | {42, 1234}


def _reproduces(guess: np.ndarray, noise: np.ndarray) -> bool:
    return float(np.corrcoef(guess, noise)[0, 1]) > 0.99  # unrelated draws of 256 entries: |r| ~ 0.06


@pytest.mark.parametrize("insecure_noise_seed", [None, 7])
def test_nothing_in_the_run_folder_reproduces_private_noise(tmp_path, insecure_noise_seed):
    """Everything an attacker could read (config, summary, metrics, every checkpoint) is tried as it would be;
    the insecure seeded run is the control: the same attack must succeed on it."""
    folder = tmp_path / "run"
    noise = _run_with_folder(folder, insecure_noise_seed)
    assert len(noise) == 10
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    saved = [checkpoint.read(p) for p in files if p.suffix == ".npz"]
    assert len(saved) >= 2
    trees = [json.loads((folder / name).read_text()) for name in ("config.json", "summary.json")] + saved
    sd = 1.0 * 0.5 * 1.0 / 4  # sigma C server_lr / B, all in the run's settings

    seeds = _seed_like(trees)
    recipes = (lambda s: np.random.default_rng([s, 17]), lambda s: np.random.default_rng(s))
    by_seed = any(_reproduces(make(seed).normal(0.0, sd, 256), noise[0]) for seed in seeds for make in recipes)

    by_state = False  # every generator state in any checkpoint (the engine's own too), tried on the next release
    for path in (p for p in files if p.suffix == ".npz"):
        version = int(checkpoint._NAME.match(path.name).group(1))
        for value in _walk(checkpoint.read(path)):
            if isinstance(value, dict) and value.get("__kind__") == "numpy-generator" and version < len(noise):
                generator = np.random.default_rng()
                generator.bit_generator.state = value["state"]
                by_state |= _reproduces(generator.normal(0.0, sd, 256), noise[version])
    dp_state = json.dumps([tree["strategy"] for tree in saved], default=str)

    if insecure_noise_seed is None:
        assert not by_seed and not by_state and "bit_generator" not in dp_state
    else:  # the control: the seed is in the summary, the generator in the checkpoints
        assert by_seed and by_state and "bit_generator" in dp_state


def test_a_private_state_holds_no_generator_and_a_seeded_one_continues_its_noise():
    def fresh(seed):
        dp = DP(FedBuff(buffer_size=2, server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0,
                insecure_noise_seed=seed)
        dp.on_start(4, concurrency=2)
        return dp

    current = np.zeros(8, np.float32)
    for seed in (None, 5):
        first = fresh(seed)
        first.on_arrival(arrival(0, np.ones(8)), current)
        saved = first.state_dict()
        kinds = [v.get("__kind__") for v in _walk(saved) if isinstance(v, dict)]
        assert ("numpy-generator" in kinds) == (seed is not None)
        resumed = fresh(seed)
        resumed.load_state_dict(saved)
        a, b = (s.on_arrival(arrival(1, np.ones(8)), current) for s in (first, resumed))
        assert np.array_equal(a, b) == (seed is not None)  # private noise: fresh entropy after a resume
        assert first.ledger.rho == resumed.ledger.rho == {"client-index:0": 1.0, "client-index:1": 1.0}


# ------------------------------------------------------------------------------- the ledger's owners
def test_the_ledger_follows_the_owner_across_a_rejoin_and_a_resume():
    dp = DP(FedBuff(buffer_size=2, server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0)
    dp.on_start(3, concurrency=2)
    current = np.zeros(4, np.float32)
    dp.on_arrival(arrival(0, np.ones(4)), current)  # charged before its owner is known
    dp.bind_owners({0: "partition-id:3", 1: "partition-id:0"})
    dp.on_arrival(arrival(1, np.ones(4)), current)
    assert dp.ledger.rho == {"partition-id:3": 1.0, "partition-id:0": 1.0}
    dp.bind_owners({2: "partition-id:3"})  # partition 3's node left and joined again: a new client index
    dp.on_arrival(arrival(2, np.ones(4)), current)
    dp.on_arrival(arrival(0, np.ones(4)), current)  # both of its indices in one step: k = 2
    assert dp.ledger.rho == {"partition-id:3": 1.0 + 4.0, "partition-id:0": 1.0}
    assert dp.summary()["dp-ledger-key"] == "partition-id"

    resumed = DP(FedBuff(buffer_size=2, server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0)
    resumed.on_start(3, concurrency=2)
    resumed.load_state_dict(dp.state_dict())
    assert resumed.ledger.rho == dp.ledger.rho and resumed.ledger.epsilon() == dp.ledger.epsilon()


# ---------------------------------------------------------------------------- federated evaluation
def test_dp_runs_no_federated_evaluation_unless_asked_and_then_warns(caplog):
    inner = FedBuff(buffer_size=4, server_lr=1.0)
    assert inner.flower.fraction_evaluate == 1.0
    default = DP(inner, noise_multiplier=1.0, clipping_norm=0.5)
    assert default.flower.fraction_evaluate == 0.0 and default.flower.min_train_nodes == inner.flower.min_train_nodes
    result = _run()
    assert not [m for m in result.grid.pushed if m.metadata.message_type == "evaluate"]
    asked = DP(FedBuff(buffer_size=4, server_lr=1.0), fraction_evaluate=0.5)
    with caplog.at_level(logging.WARNING, logger="asyncfl.privacy"):
        asked.on_start(8, concurrency=4)
    assert asked.flower.fraction_evaluate == 0.5 and "NOT covered by the accounting" in caplog.text


# ------------------------------------------------------------------------------------- clipping on the clients
def _client_side_run(with_mod: bool):
    from flwr.app import Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.clientapp.mod import fixedclipping_mod

    from asyncfl import DifferentialPrivacyClientSideFixedClipping
    from asyncfl.simulation.inprocess import InProcessGrid

    app = ClientApp(mods=[fixedclipping_mod] if with_mod else [])

    @app.train()
    def train(msg, context):  # a step of 2 per weight toward 1: norm 16 over 64 weights, far beyond the clip
        w = msg.content["arrays"]["w"].numpy()
        trained = ArrayRecord({"w": Array((w + np.float32(2.0)).astype(np.float32))})
        return Message(RecordDict({"arrays": trained, "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    dp = DifferentialPrivacyClientSideFixedClipping(FedBuff(buffer_size=2, server_lr=1.0, fraction_evaluate=0.0),
                                                    noise_multiplier=0.1, clipping_norm=0.5)
    grid = InProcessGrid(app, 4, {})
    result = dp.start(grid, ArrayRecord({"w": Array(np.zeros(64, np.float32))}), num_rounds=0,
                      train_config=ConfigRecord({}), clock="virtual", delay_model="uniform-speed", seed=1,
                      max_arrivals=8, concurrency=2)
    return result.summary


def test_client_side_clipping_sends_the_norm_flowers_mod_clips_to_and_the_server_checks_it():
    with_mod = _client_side_run(with_mod=True)
    assert with_mod["dp-clipped-by-server"] == 0 and with_mod["dp-releases"] == 4 and with_mod["dp-epsilon"] > 0
    without = _client_side_run(with_mod=False)  # a ClientApp without the mod: the server clips every update
    assert without["dp-clipped-by-server"] == 8 and without["dp-epsilon"] == with_mod["dp-epsilon"]


def test_flowers_dp_wrapper_arguments_are_taken_positionally_and_by_name(caplog):
    from asyncfl import DifferentialPrivacyClientSideFixedClipping

    # Prepare / Execute: Flower's call, (strategy, noise_multiplier, clipping_norm, num_sampled_clients), both ways
    for cls in (DP, DifferentialPrivacyClientSideFixedClipping):
        by_name = cls(FedBuff(buffer_size=5, server_lr=1.0), noise_multiplier=0.8, clipping_norm=0.5,
                      num_sampled_clients=10)
        by_position = cls(FedBuff(buffer_size=5, server_lr=1.0), 0.8, 0.5, 10)
        # Assert: the same wrapper; the count is kept, and the run says in one line that it sets nothing here
        for dp in (by_name, by_position):
            assert (dp.config.noise_multiplier, dp.config.clipping_norm, dp.num_sampled_clients) == (0.8, 0.5, 10)
    with caplog.at_level(logging.INFO, logger="asyncfl.privacy"):
        by_position.on_start(10, concurrency=10)
    said = [r.getMessage() for r in caplog.records if "num_sampled_clients" in r.getMessage()]
    assert len(said) == 1 and "sets nothing" in said[0] and "server_lr / buffer_size = 1 / 5" in said[0]


@pytest.mark.parametrize("keywords, says", [
    ({"num_sampled_clients": 0}, "num_sampled_clients=0 must be a positive integer"),
    ({"num_sampled_clients": 2.5}, "num_sampled_clients=2.5 must be a positive integer"),
    ({"accountant": object()}, "accountant=: Flower's PrivacyAccountant"),
])
def test_flowers_dp_arguments_that_cannot_mean_anything_here_are_refused(keywords, says):
    with pytest.raises(ConfigError, match=says):
        DP(FedBuff(server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0, **keywords)


def test_a_strategy_with_its_own_aggregate_train_is_refused_under_dp():
    class Mine(FedBuff):
        def aggregate_train(self, server_round, replies):
            return super().aggregate_train(server_round, replies)

    with pytest.raises(ConfigError, match="Mine overrides aggregate_train"):
        DP(Mine(server_lr=1.0), noise_multiplier=1.0, clipping_norm=1.0)
