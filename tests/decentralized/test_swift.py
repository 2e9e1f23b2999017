"""SWIFT (Bornstein et al., 2023): the neighbour cache, its update rule, and its run on the relay."""

import json

import numpy as np
import pytest

from asyncfl.decentralized.swift import NeighbourCache, Swift, swift_merge
from asyncfl.server_app.relay import GossipRelay
from tests.server_app.test_relay import run_relay


def test_cache_keeps_the_newest_model_per_sender_and_drops_the_least_recently_heard():
    cache = NeighbourCache(capacity=2)
    cache.put(1, {"w": np.array([1.0])})
    cache.put(2, {"w": np.array([2.0])})
    cache.put(1, {"w": np.array([10.0])})  # replaces sender 1's model, sender 1 is now the most recent
    assert cache.senders() == [2, 1] and [m["w"][0] for m in cache.models()] == [2.0, 10.0]
    cache.put(3, {"w": np.array([3.0])})  # full: sender 2 was heard from least recently
    assert cache.senders() == [1, 3] and len(cache) == 2
    with pytest.raises(ValueError, match="capacity"):
        NeighbourCache(0)


def test_swift_update_is_the_mean_of_own_and_cached_plus_the_local_delta():
    # own w = [1, 2], trained w = [0.5, 3] (delta [-0.5, 1]); cached [3, 2] and [5, 8]
    own = {"w": np.array([1.0, 2.0], dtype=np.float32), "bn": np.array([0.0], dtype=np.float32)}
    trained = {"w": np.array([0.5, 3.0], dtype=np.float32), "bn": np.array([7.0], dtype=np.float32)}
    cached = [{"w": np.array([3.0, 2.0], dtype=np.float32)}, {"w": np.array([5.0, 8.0], dtype=np.float32)}]
    out = swift_merge(own, trained, cached, shared=["w"])
    # mean([1,2],[3,2],[5,8]) = [3, 4]; + delta -> [2.5, 5]
    np.testing.assert_allclose(out["w"], [2.5, 5.0])
    assert out["w"].dtype == np.float32 and out["bn"][0] == 7.0  # unshared entries (BatchNorm) stay local
    # nothing cached: the trained model exactly
    np.testing.assert_array_equal(swift_merge(own, trained, [], ["w"])["w"], trained["w"])


def test_swift_on_the_relay_keeps_a_bounded_cache_and_sends_full_models(tmp_path):
    relay, contexts, _ = run_relay(tmp_path, "swift", **{"swift.cache-size": 2})
    summary = json.loads((tmp_path / "swift" / "summary.json").read_text())
    assert summary["pushes"] > 0 and summary["rejected-by-reason"] == {}
    assert summary["message-bytes-mean"] > 4 * 64 * 64  # full float32 models, like Async-DFedAvg
    assert 0.0 < summary["final-mean-accuracy"] <= 1.0
    cached = [list(c.state.config_records["swift-cache-order"]["senders"]) for c in contexts.values()
              if "swift-cache-order" in c.state.config_records]
    assert cached and all(1 <= len(s) <= 2 and len(set(s)) == len(s) for s in cached)
    # each peer keeps the model its last event trained (a restart's start), a whole model; forget drops it all
    context = next(c for c in contexts.values() if "swift-cache" in c.state.array_records)
    trained, stored = Swift().last_trained(context), context.state.array_records["gossip-model"]
    assert set(trained) == set(stored) and any(not np.array_equal(trained[n], stored[n].numpy()) for n in trained)
    Swift().forget(context)
    assert Swift().last_trained(context) is None and "swift-cache" not in context.state.array_records


def test_fixed_topology_sends_only_along_a_static_graph(tmp_path, monkeypatch):
    deliveries = []
    schedule = GossipRelay._schedule

    def recording(self, at, kind, peer, payload=None):
        if kind == "deliver":
            deliveries.append((payload[0], peer))
        schedule(self, at, kind, peer, payload)

    monkeypatch.setattr(GossipRelay, "_schedule", recording)
    relay, _, _ = run_relay(tmp_path, "async-dfedavg", **{"gossip.topology": "fixed"})
    assert all(len(out) == 2 and i not in out for i, out in relay.out_neighbours.items())
    assert len(deliveries) > 10 and all(receiver in relay.out_neighbours[sender] for sender, receiver in deliveries)
    deliveries.clear()
    random_topology, _, _ = run_relay(tmp_path / "random", "async-dfedavg")
    assert random_topology.out_neighbours == {}
    edges = {(s, r) for s, r in deliveries}
    assert len({r for s, r in edges if s == deliveries[0][0]}) > 2  # resampled: a sender reaches > out-degree peers


def test_bad_topology_and_cache_size_are_refused_before_anything_runs():
    from asyncfl.config import ConfigError, parse_run_config
    from tests.server_app.test_relay import DEFAULTS

    base = {**DEFAULTS, "strategy": "swift", "max-time": 5.0}
    with pytest.raises(ConfigError,
                       match=r"topology=.ring. is not valid; choose one of: random, fixed \(run-config gossip.topo"):
        parse_run_config({**base, "gossip.topology": "ring"})
    with pytest.raises(ConfigError, match="swift.cache-size"):
        parse_run_config({**base, "swift.cache-size": 0})
