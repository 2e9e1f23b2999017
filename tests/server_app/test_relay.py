"""The gossip relay with real peer handlers over a fake Grid: ordering, mass, bytes, delayed peers."""

import json
import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from asyncfl.client_app.app import gossip_data
from asyncfl.client_app.gossip import gossip_event
from asyncfl.client_app.task import node_model
from asyncfl.config import ConfigError, parse_run_config
from asyncfl.server_app.relay import GossipRelay
from tests.fake_grid import FakeGrid

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def run_relay(tmp_path, method, peers=6, **overrides):
    run_config = {**DEFAULTS, "strategy": method, "dataset": "digits", "model": "mlp", "optimizer": "sgd", "lr": 0.05,
                  "local-steps": 3, "max-time": 4.0, "gossip.eval-points": 4, "gossip.out-degree": 2,
                  "gossip.buffer-capacity": 2, "gossip.delayed-fraction": 0.2, "pushcen.k": 8,
                  "delay-model": "fedrevive-default", **overrides}
    cfg = parse_run_config(run_config)
    contexts = {101 + i: Context(run_id=1, node_id=101 + i, node_config={"partition-id": i, "num-partitions": peers},
                                 state=RecordDict(), run_config=run_config) for i in range(peers)}

    def handler(node, message):
        context = contexts[node]
        data = gossip_data(cfg, int(context.node_config["partition-id"]), peers)  # the ClientApp's own door
        return gossip_event(message, context, cfg, data, node_model(cfg.data, data, cfg.options.seed))

    grid = FakeGrid(peers, handler)
    relay = GossipRelay(grid, cfg.strategy, cfg.gossip, cfg.options, cfg.timeout, cfg.train.to_message_config(),
                        tmp_path / method)
    relay.run()
    return relay, contexts, grid


def test_peers_tested_on_a_held_out_set_report_its_accuracy_in_steps_of_one_example(tmp_path):
    relay, _, _ = run_relay(tmp_path, "async-dfedavg", peers=4, **{"gossip.local-test-size": 40,
                                                                   "max-samples-per-client": 30})
    accuracies = [value for value in relay.accuracy.values()]
    assert accuracies and all(abs(a * 40 - round(a * 40)) < 1e-6 for a in accuracies)  # 40 test examples each


def test_pushcen_relay_runs_conserves_mass_and_reports_accuracy(tmp_path):
    relay, contexts, grid = run_relay(tmp_path, "pushcen")
    summary = json.loads((tmp_path / "pushcen" / "summary.json").read_text())
    assert summary["events"] > 6 and summary["pushes"] > 0 and summary["rejected-by-reason"] == {}
    assert len(summary["delayed-peers"]) == 1 and 0.0 < summary["final-mean-accuracy"] <= 1.0
    rows = (tmp_path / "pushcen" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 4
    # Mass: the relay's ledger (peers between events, and what each peer in flight took in) + buffered + absorbed
    # + deliveries still pending (+ shares never sent: none here) = one per peer; an honest peer's own mass is the
    # ledger's.
    ledger = sum(relay.in_flight[i].mass if i in relay.in_flight else relay.mass[i] for i in range(len(relay.peers)))
    buffered = sum(e.mass for b in relay.buffers for e in b.entries()) + sum(relay.absorbed)
    pending = sum(payload[2] for _, _, kind, _, payload in relay._events if kind == "deliver")
    assert ledger + buffered + pending + relay.stats.mass_unsent == pytest.approx(len(relay.peers), abs=1e-9)
    assert relay.stats.mass_unsent == 0.0  # every honest event sends every share
    for i, node in enumerate(relay.peers):
        if i not in relay.in_flight and "gossip-meta" in contexts[node].state.config_records:
            assert contexts[node].state.config_records["gossip-meta"]["mass"] == relay.mass[i]
    # bytes on the wire come from the real ArrayRecords: k=8 -> 3-bit indices, much smaller than float32
    assert 0 < summary["message-bytes-mean"] < 0.2 * 4 * 64 * 64


def test_async_dfedavg_sends_full_models_divshare_fragments_independent_nothing(tmp_path):
    run_relay(tmp_path, "async-dfedavg")
    run_relay(tmp_path, "divshare")
    run_relay(tmp_path, "independent")
    full = json.loads((tmp_path / "async-dfedavg" / "summary.json").read_text())
    assert full["message-bytes-mean"] > 4 * 64 * 64  # the MLP's first layer alone, float32
    fragments = json.loads((tmp_path / "divshare" / "summary.json").read_text())
    assert fragments["pushes"] > 0 and fragments["rejected-by-reason"] == {}
    # out-degree 2: each neighbour gets half the model, so one push costs about one model
    assert fragments["push-bytes-mean"] == pytest.approx(full["message-bytes-mean"], rel=0.01)
    alone = json.loads((tmp_path / "independent" / "summary.json").read_text())
    assert alone["pushes"] == 0 and alone["events"] > 6


def test_divshare_copies_send_each_fragment_to_that_many_neighbours(tmp_path):
    # DivShare's J = 2 at out-degree 2: one fragment (the whole model), sent to both out-neighbours (no delayed
    # peers, so every push has both)
    run_relay(tmp_path / "j1", "divshare", **{"gossip.delayed-fraction": 0.0})
    run_relay(tmp_path / "j2", "divshare", **{"gossip.delayed-fraction": 0.0, "divshare.copies": 2})
    one = json.loads((tmp_path / "j1" / "divshare" / "summary.json").read_text())
    two = json.loads((tmp_path / "j2" / "divshare" / "summary.json").read_text())
    assert two["pushes"] > 0 and two["rejected-by-reason"] == {}
    # each neighbour gets what a J = 1 push spreads over both (the whole model; one record's framing less), and a
    # push is two of those: twice the bytes
    assert two["message-bytes-mean"] == pytest.approx(one["push-bytes-mean"], rel=0.02)
    assert two["push-bytes-mean"] == pytest.approx(2 * two["message-bytes-mean"])
    assert one["push-bytes-mean"] == pytest.approx(2 * one["message-bytes-mean"])
    with pytest.raises(ConfigError,
                       match=r"divshare_copies=3 must be in \[1, gossip.out-degree = 2\] \(run-config divshare"):
        parse_run_config({**DEFAULTS, "strategy": "divshare", "max-time": 5.0, "gossip.out-degree": 2,
                          "divshare.copies": 3})
    with pytest.raises(ConfigError, match="setting of strategy 'divshare'.*'pushcen'"):
        parse_run_config({**DEFAULTS, "strategy": "pushcen", "max-time": 5.0, "divshare.copies": 2})
    with pytest.raises(ConfigError, match="resume-from='runs/x': the gossip relay .pushcen. keeps no checkpoints"):
        parse_run_config({**DEFAULTS, "strategy": "pushcen", "max-time": 5.0, "resume-from": "runs/x"})


def test_same_seed_same_gossip_metrics(tmp_path):
    run_relay(tmp_path / "a", "pushcen")
    run_relay(tmp_path / "b", "pushcen")
    assert (tmp_path / "a" / "pushcen" / "metrics.csv").read_text() == (tmp_path / "b" / "pushcen" / "metrics.csv").read_text()


def test_gossip_needs_a_virtual_horizon():
    with pytest.raises(ConfigError, match="max-time"):
        parse_run_config({**DEFAULTS, "strategy": "pushcen", "max-time": 0.0})
    with pytest.raises(ConfigError, match="pushcen.k"):
        parse_run_config({**DEFAULTS, "strategy": "pushcen", "max-time": 5.0, "pushcen.k": 1})


def test_relay_writes_its_final_summary_itself_atomically(tmp_path):
    relay, _, _ = run_relay(tmp_path, "pushcen")
    written = json.loads((tmp_path / "pushcen" / "summary.json").read_text())
    assert written["events"] == relay.stats.events and written["server-peak-rss-mb"] > 0
    assert not list((tmp_path / "pushcen").glob("*.tmp"))
