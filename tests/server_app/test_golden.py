"""Golden digests of seeded runs: what the server sends, what strategies see, what the relay writes.

Written on the runtime before its refactor into one options object, a Clock and a shared
transport (issue "One options object, a Clock, one runtime"), so that refactor is checked
against the exact behaviour it replaces: the destination, model version, job seed, dispatch
time and round of every train request, every arrival a strategy is handed (client, staleness,
clock time, base version, the update's bytes), the final model, and the gossip relay's
``metrics.csv``. A digest changes only when a run's behaviour does; if a change is intended,
say why in the commit and update the digest.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from asyncfl.strategies import FedAsync, FedAvg, FedBuff
from tests.fake_grid import FakeGrid, trained_reply
from tests.server_app.test_relay import run_relay

NODES = 8


def _initial() -> ArrayRecord:
    """A float weight and an integer buffer (as BatchNorm's ``num_batches_tracked``)."""
    return ArrayRecord({"w": Array(np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)),
                        "steps": Array(np.zeros(1, dtype=np.int64))})


def _client(node: int, message):
    """A client whose update depends on the model it got, its node and its job seed (so order matters)."""
    record = message.content.array_records["arrays"]
    w = record["w"].numpy()
    if message.metadata.message_type == "evaluate":
        metrics = MetricRecord({"num-examples": 5, "accuracy": float(np.abs(w).mean()), "loss": float(w.sum())})
        return Message(RecordDict({"metrics": metrics}), reply_to=message)
    seed = int(message.content.config_records["config"]["job-seed"])
    pull = np.float32(0.3) * (np.float32((seed % 97) / 97.0) - w)
    out = ArrayRecord({"w": Array(w + pull + np.float32(node % 5) * np.float32(0.01)),
                       "steps": Array(record["steps"].numpy() + 1)})
    return trained_reply(message, out, num_examples=10 + node % 3)


class Digest:
    """sha256 over the run's requests, arrivals and final model."""

    def __init__(self) -> None:
        self.requests = hashlib.sha256()
        self.arrivals = hashlib.sha256()

    def wrap(self, strategy):
        seen = strategy.on_arrival

        def on_arrival(arrival, current):
            self.arrivals.update(struct.pack("<iiidq", arrival.client_index, arrival.base_version, arrival.staleness,
                                             arrival.time, arrival.num_examples))
            self.arrivals.update(np.ascontiguousarray(arrival.weights).tobytes())
            return seen(arrival, current)

        strategy.on_arrival = on_arrival
        return strategy

    def add_requests(self, grid: FakeGrid) -> None:
        for message in grid.pushed:
            if message.metadata.message_type == "query":
                continue
            config = message.content.config_records["config"]
            self.requests.update(repr((message.metadata.message_type, message.metadata.dst_node_id,
                                       config["model-version"], config.get("job-seed"),
                                       round(float(config.get("dispatch-time", -1.0)), 9),
                                       config["server-round"])).encode())


def _run(strategy, **engine) -> dict[str, str]:
    digest = Digest()
    grid = FakeGrid(NODES, _client)
    result = digest.wrap(strategy).start(grid, _initial(), num_rounds=5, train_config=ConfigRecord({"lr": 0.1}),
                                         clock="virtual", delay_model="fedrevive-default", seed=11, **engine)
    digest.add_requests(grid)
    final = result.arrays
    model = hashlib.sha256(final["w"].numpy().tobytes() + final["steps"].numpy().tobytes()).hexdigest()
    return {"requests": digest.requests.hexdigest()[:16], "arrivals": digest.arrivals.hexdigest()[:16],
            "model": model[:16], "versions": result.summary["server-versions"],
            "federated": hashlib.sha256(repr(sorted((r, dict(m)) for r, m in result.evaluate_metrics_clientapp.items()))
                                        .encode()).hexdigest()[:16]}


# "arrivals", "model" and "federated" changed once, intended (issue 56): the update-norm bound is per participant
# and bounds from the first arrival (before three clients are known, at 3 x a tenth of the first model's norm, a client's k-th
# update in that phase at 1/k^2 of it; a client over its share of updates at 1/r^2), so
# this client's early updates (a third of the distance to a random point) are clipped where they passed before;
# the requests' schedule kept its digests.
# "requests" and "federated" changed once before, intended: the ClientApps no longer evaluate the initial model (round 0),
# as Flower's FedAvg does not; arrivals, models and versions kept their digests.
GOLDEN = {
    "fedbuff": {"requests": "e77dee0e606bea4e", "arrivals": "3f80a374f8431546", "model": "d2d62de8143266d8",
                "versions": 8, "federated": "f06edf1285049292"},
    # the step that follows the clients' measured response (asyncfl/strategies/pace.py)
    # the measured pace pairs each update with its own client's previous one (it paired across clients before)
    "fedbuff-measured": {"requests": "e77dee0e606bea4e", "arrivals": "14031947c7c18cdc", "model": "387a2df987fa81ab",
                         "versions": 8, "federated": "2d68225f18f68043"},
    # the defaults since the drop-in study's buffer rows: B = K // 4 within [2, 10] (2 here) and the measured pace
    "fedbuff-auto-buffer": {"requests": "91c69af8b1c91fd3", "arrivals": "1000bc0e187dedaf", "model": "6b72d772c2f6409b",
                            "versions": 20, "federated": "1a1acd830e1145e2"},
    # today's default: a freed slot waits up to a tenth of a job for the buffer's step (dispatch_hold, FedBuff's 0.1)
    "fedbuff-held": {"requests": "fc10ab5e59884969", "arrivals": "548276ed0927c49e", "model": "e03c34f59059e68f",
                     "versions": 20, "federated": "a49885c9d69ab472"},
    # the update bound weighs each update by s(tau) (a fresh update moves FedAsync's model most): arrivals change
    "fedasync-overlap": {"requests": "87f9ac419357d85c", "arrivals": "7c8868898bd4c770", "model": "666d634acae358a6",
                         "versions": 40, "federated": "cbcbe0b7854ff390"},
    "fedavg-deadline-pipelined": {"requests": "6d5324990066602d", "arrivals": "eced3a8cea81cb73",
                                  "model": "3d411a2115193aaf", "versions": 5, "federated": "b511d5cc7765e9f0"},
}


def test_fedbuff_on_the_virtual_clock_is_unchanged():
    # the defaults when the first two digests were taken: B = 5 with the stable or the measured pace
    # (dispatch_hold=0: every freed slot went out at once then; the held default has its own digest)
    assert _run(FedBuff(buffer_size=5, pace="stable"), dispatch_hold=0.0) == GOLDEN["fedbuff"]
    assert _run(FedBuff(buffer_size=5, pace="measured"), dispatch_hold=0.0) == GOLDEN["fedbuff-measured"]
    assert _run(FedBuff(), dispatch_hold=0.0) == GOLDEN["fedbuff-auto-buffer"]
    assert _run(FedBuff()) == GOLDEN["fedbuff-held"]


def test_fedasync_with_overlapped_server_compute_is_unchanged():
    # alpha = 0.6, the default when the digest was taken (the default is 1 since the drop-in study's lr-0.01 rows)
    assert _run(FedAsync(alpha=0.6), overlap_server_compute=True) == GOLDEN["fedasync-overlap"]


def test_semi_asynchronous_rounds_with_pipelined_late_clients_are_unchanged():
    assert _run(FedAvg(), round_deadline=1.5, pipeline_late_clients=True) == GOLDEN["fedavg-deadline-pipelined"]


# pushcen.penalty "sum" was the only regulariser when the first digest was taken; "layer-mean" is today's default
GOLDEN_RELAY = {"sum": "2488eafd24e44b22", "layer-mean": "27b427648163b886"}


@pytest.mark.parametrize("penalty", sorted(GOLDEN_RELAY))
def test_gossip_relay_metrics_are_unchanged(tmp_path, penalty):
    run_relay(tmp_path, "pushcen", **{"pushcen.penalty": penalty})
    metrics = (tmp_path / "pushcen" / "metrics.csv").read_bytes()
    assert hashlib.sha256(metrics).hexdigest()[:16] == GOLDEN_RELAY[penalty]

