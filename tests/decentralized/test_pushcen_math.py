"""PushCen-ADFL peer math: WCP, bit packing, push-sum mass, the dedup buffer, the centroid regulariser."""

import numpy as np
import pytest
import torch

from asyncfl.decentralized.bitpack import pack_indices, unpack_indices
from asyncfl.decentralized.buffer import DedupBuffer
from asyncfl.decentralized.pushsum import push_sum_merge, split_mass
from asyncfl.decentralized.regularizer import centroid_anchor, enforce_mask_, proximal_penalty
from asyncfl.decentralized.wcp import encoded_bytes, index_bits, nearest_sorted, wcp_encode


def test_wcp_keeps_one_zero_centroid_sorted_and_bounds_the_error():
    rng = np.random.default_rng(0)
    layer = rng.standard_normal((64, 50)).astype(np.float32) * 0.1
    encoded = wcp_encode(layer, k=32)
    assert encoded.k == 32 and np.count_nonzero(encoded.centroids == 0.0) == 1
    assert np.all(np.diff(encoded.centroids) > 0)  # SortRemap: strictly ascending
    decoded = encoded.decode()
    assert decoded.shape == layer.shape
    # every weight decodes to its nearest centroid
    nearest = np.min(np.abs(layer.reshape(-1, 1) - encoded.centroids[None, :]), axis=1)
    np.testing.assert_allclose(np.abs(decoded - layer).reshape(-1), nearest, atol=1e-7)
    assert np.abs(decoded - layer).mean() < 0.01  # 32 levels on a 0.1-scale Gaussian
    # pruned = assigned to zero, and exactly those decode to 0
    assert np.array_equal(encoded.mask(), decoded != 0.0)


def test_wcp_warm_start_from_the_dictionary_and_bigger_k_is_finer():
    rng = np.random.default_rng(1)
    layer = rng.standard_normal(2000).astype(np.float32)
    trained = wcp_encode(layer, k=16, iterations=30)
    warm = wcp_encode(layer, k=16, init=trained.centroids, iterations=1)
    cold = wcp_encode(layer, k=16, iterations=1)
    error = lambda e: np.abs(e.decode() - layer).mean()  # noqa: E731
    assert error(warm) < error(cold)  # one Lloyd step from the dictionary beats one from scratch
    assert np.abs(warm.centroids - trained.centroids).max() < 0.1
    errors = [np.abs(wcp_encode(layer, k=k).decode() - layer).mean() for k in (4, 8, 32)]
    assert errors[0] > errors[1] > errors[2]
    with pytest.raises(ValueError, match="2 <= k"):
        wcp_encode(layer, k=1)


def test_nearest_centroid_by_midpoints():
    centroids = np.array([-1.0, 0.0, 2.0])
    assert nearest_sorted(np.array([-0.6, -0.4, 0.9, 1.1, 5.0]), centroids).tolist() == [0, 1, 1, 2, 2]


def test_payload_is_k_minus_one_centroids_plus_packed_indices():
    encoded = wcp_encode(np.linspace(-1, 1, 1000, dtype=np.float32), k=32)
    assert index_bits(32) == 5 and index_bits(2) == 1 and index_bits(33) == 6
    assert encoded_bytes(encoded) == 4 * 31 + 625  # 1000 * 5 bits = 625 bytes
    assert 4 * 1000 / encoded_bytes(encoded) > 5  # vs float32: ~32/5


@pytest.mark.parametrize("bits", [1, 3, 5, 8, 11, 16])
def test_bit_packing_round_trip(bits):
    rng = np.random.default_rng(bits)
    indices = rng.integers(0, 1 << bits, size=997)
    payload = pack_indices(indices, bits)
    assert len(payload) == -(-997 * bits // 8)
    np.testing.assert_array_equal(unpack_indices(payload, 997, bits), indices)
    with pytest.raises(ValueError, match="does not fit"):
        pack_indices(np.array([1 << bits]), bits)


def test_push_sum_merge_by_hand():
    merged, mass = push_sum_merge(np.array([0.0, 3.0]), 1.0, [(np.array([3.0, 0.0]), 0.5), (np.array([6.0, 6.0]), 0.5)])
    assert mass == 2.0
    np.testing.assert_allclose(merged, [(0 + 1.5 + 3) / 2, (3 + 0 + 3) / 2])
    assert split_mass(1.0, 3) == 0.25


def test_system_mass_and_weighted_average_are_conserved_over_random_events():
    # Prepare: 8 peers with scalar "models"; random pushes to 3 random out-neighbours, random deliveries
    # (so messages sit in flight), small buffers with dedup and overflow.
    rng = np.random.default_rng(7)
    n = 8
    models = rng.standard_normal(n)
    masses = np.ones(n)
    buffers = [DedupBuffer(capacity=2) for _ in range(n)]
    in_flight: list[tuple[int, int, float, float]] = []  # (sender, receiver, model, mass)
    invariant = float(np.sum(models * masses))

    def totals():
        mass = masses.sum() + sum(m for *_, m in in_flight) + sum(b.mass for b in buffers)
        weighted = (np.sum(models * masses) + sum(x * m for _, _, x, m in in_flight)
                    + sum(e.payload * e.mass for b in buffers for e in b.entries()))
        return mass, weighted

    # Act
    for _ in range(500):
        event = rng.random()
        i = int(rng.integers(n))
        if event < 0.4:  # compute event: aggregate the buffer, then push
            received = [(e.payload, e.mass) for _, e in buffers[i].drain()]
            merged, masses[i] = push_sum_merge(np.array([models[i]]), masses[i], [(np.array([x]), m) for x, m in received])
            models[i] = merged[0] + 0.0  # (local training would move it; mass bookkeeping is what is tested)
            share = split_mass(masses[i], 3)
            masses[i] = share
            for j in rng.choice([p for p in range(n) if p != i], size=3, replace=False):
                in_flight.append((i, int(j), models[i], share))
        elif in_flight:  # deliver a random in-flight message
            sender, receiver, x, m = in_flight.pop(int(rng.integers(len(in_flight))))
            dropped = buffers[receiver].put(sender, x, m)
            masses[receiver] += dropped
        mass, _ = totals()
        assert mass == pytest.approx(n, abs=1e-9)
    # Assert: no mass lost or created, and dedup/overflow actually happened
    assert sum(b.replaced for b in buffers) > 0 and sum(b.overflowed for b in buffers) > 0
    assert totals()[0] == pytest.approx(n, abs=1e-9)
    assert invariant == pytest.approx(invariant)


def test_dedup_buffer_keeps_only_the_newest_per_sender_and_respects_capacity():
    buffer = DedupBuffer(capacity=2)
    assert buffer.put(1, "a1", 0.5) == 0.0
    assert buffer.put(2, "b1", 0.25) == 0.0
    assert buffer.put(1, "a2", 0.5) == 0.0  # replaces a1, carries its mass, becomes the newest
    assert len(buffer) == 2 and buffer.replaced == 1
    assert buffer.put(3, "c1", 0.125) == 0.25  # over capacity: the oldest (b1) goes, its mass handed back
    drained = buffer.drain()
    assert [(s, e.payload, e.mass) for s, e in drained] == [(1, "a2", 1.0), (3, "c1", 0.125)]
    assert len(buffer) == 0
    no_dedup = DedupBuffer(capacity=5, dedup=False)
    no_dedup.put(1, "a1", 0.5)
    no_dedup.put(1, "a2", 0.5)
    assert [(s, e.payload) for s, e in no_dedup.drain()] == [(1, "a1"), (1, "a2")]
    with pytest.raises(ValueError, match="capacity"):
        DedupBuffer(0)


def test_centroid_regulariser_gradient_and_mask_on_a_toy_tensor():
    dictionary = np.array([-0.5, 0.0, 0.5], np.float32)
    indices = np.array([0, 1, 2, 2])
    anchor = torch.from_numpy(centroid_anchor(indices, dictionary, (2, 2)))
    assert anchor.tolist() == [[-0.5, 0.0], [0.5, 0.5]]
    weights = torch.tensor([[-0.4, 0.3], [0.5, 1.0]], requires_grad=True)
    penalty = proximal_penalty(weights, anchor, lam=0.1)
    assert penalty.item() == pytest.approx(0.1 * (0.01 + 0.09 + 0.0 + 0.25))
    penalty.backward()
    torch.testing.assert_close(weights.grad, 2 * 0.1 * (weights.detach() - anchor))
    enforce_mask_(weights.data, torch.from_numpy(indices.reshape(2, 2) != 1))
    assert weights.detach().tolist()[0][1] == 0.0


def test_the_reference_codes_layer_mean_penalty_is_the_sum_over_the_layer_size():
    from asyncfl.decentralized.peer import PeerConfig
    from asyncfl.decentralized.settings import GossipConfig

    anchor = torch.zeros(2, 2)
    weights = torch.tensor([[0.1, 0.3], [0.0, 1.0]], requires_grad=True)
    mean = proximal_penalty(weights, anchor, lam=0.1, reduction="layer-mean")
    assert mean.item() == pytest.approx(0.1 * (0.01 + 0.09 + 0.0 + 1.0) / 4)
    mean.backward()
    torch.testing.assert_close(weights.grad, 2 * 0.1 * weights.detach() / 4)
    assert PeerConfig().penalty == "layer-mean" and GossipConfig().penalty == "layer-mean"
    with pytest.raises(ValueError, match="penalty='l2' is not valid; choose one of: layer-mean, sum"):
        PeerConfig(penalty="l2")
    with pytest.raises(ValueError, match=r"choose one of: layer-mean, sum \(run-config pushcen.penalty\)"):
        GossipConfig(penalty="mean")


def test_model_message_round_trip_keeps_batchnorm_local_and_shrinks_the_payload():
    from asyncfl.decentralized.codec import Layout, decode_message, encode_state, message_bytes, with_zero
    from asyncfl.models import build_model

    model = build_model("cnn", (1, 28, 28), 10, batchnorm=True, seed=0)
    layout = Layout.of(model)
    state = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    assert {n for n, kind in layout.kinds.items() if kind == "local"} >= {n for n in state if "running_var" in n}
    message, encoded = encode_state(state, layout, k=32)
    dense, tables = decode_message(message, layout)
    assert set(dense) == {n for n, kind in layout.kinds.items() if kind != "local"}
    for name in layout.clustered():
        np.testing.assert_array_equal(dense[name], encoded[name].decode())
        np.testing.assert_array_equal(tables[name], encoded[name].centroids)
        assert message[name + "::indices"].dtype == np.uint8
    full = sum(state[n].nbytes for n, kind in layout.kinds.items() if kind != "local")
    assert full / message_bytes(message) > 5.5  # 32 bits -> 5-bit indices, plus raw biases
    assert with_zero(np.array([-1.0, 2.0], np.float32)).tolist() == [-1.0, 0.0, 2.0]


def test_a_compute_event_merges_trains_encodes_and_splits_mass():
    from asyncfl.decentralized.codec import Layout
    from asyncfl.decentralized.peer import PeerConfig, PeerState, Received, compute_event
    from asyncfl.models import build_model

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 40)
    model = build_model("mlp", (1, 8, 8), 10, seed=0)
    layout = Layout.of(model)
    config = PeerConfig(k=8, lam=0.1, out_degree=3)
    state = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    peers = [PeerState(dict(state)), PeerState({n: v + 0.01 for n, v in state.items()})]
    first, share, _ = compute_event(peers[1], model, layout, config, [], x, y, steps=3, batch_size=8, lr=0.1,
                                    momentum=0.0, seed=1)
    assert share == peers[1].mass == 0.25 and set(peers[1].dictionary) == set(layout.clustered())
    message, share0, loss = compute_event(peers[0], model, layout, config, [Received(first, share)], x, y, steps=3,
                                          batch_size=8, lr=0.1, momentum=0.0, seed=2)
    assert share0 == pytest.approx((1.0 + 0.25) / 4) and np.isfinite(loss)
    for name in layout.clustered():
        table = peers[0].dictionary[name]
        assert np.count_nonzero(table == 0.0) == 1 and len(table) == 8
        assert np.count_nonzero(peers[0].state[name] == 0.0) > 0  # pruned coordinates held at exactly 0
    assert any(k.endswith("::indices") for k in message)


def test_divshare_fragments_partition_the_model_and_merge_per_coordinate():
    from asyncfl.decentralized.divshare import Fragment, fragment_indices, merge_fragments, split_model

    parts = fragment_indices(10, 3, seed=5)
    assert sorted(np.concatenate(parts).tolist()) == list(range(10)) and [len(p) for p in parts] == [4, 3, 3]
    own = np.zeros(10, np.float32)
    sender = np.arange(10, dtype=np.float32)
    fragments = split_model(sender, 3, seed=5)
    assert sum(f.values.size for f in fragments) == 10  # one model in total across the neighbours
    merged = merge_fragments(own, [fragments[0]])
    expected = np.zeros(10)
    expected[parts[0]] = sender[parts[0]] / 2  # own 0 and the received value, averaged
    np.testing.assert_allclose(merged, expected)
    twice = merge_fragments(own, [fragments[1], Fragment(fragments[1].values + 3, 5, 1, 3)])
    np.testing.assert_allclose(twice[parts[1]], (sender[parts[1]] + sender[parts[1]] + 3) / 3)


def test_gossip_local_training_uses_the_runs_optimizer():
    from asyncfl.decentralized.peer import train_with_anchor

    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    y = np.array([0, 1] * 4)

    def one_step(optimizer):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        before = model.weight.detach().clone()
        train_with_anchor(model, x, y, {}, {}, 0.0, steps=1, batch_size=8, lr=0.01, momentum=0.0, seed=0,
                          optimizer=optimizer)
        return (model.weight.detach() - before).abs()

    adam, sgd = one_step("adam"), one_step("sgd")
    # Adam's first step moves every coordinate by lr (g / |g|); SGD's by lr * |g|, which differs per coordinate
    torch.testing.assert_close(adam, torch.full_like(adam, 0.01), rtol=1e-3, atol=1e-6)
    assert not torch.allclose(sgd, torch.full_like(sgd, 0.01), rtol=1e-2)
    with pytest.raises(ValueError, match="valid: sgd, adam"):
        one_step("rmsprop")
