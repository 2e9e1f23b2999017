"""One hostile or broken peer against the gossip relay and its honest neighbours (fake Grid, real peers).

Node 101 (peer 0) answers each activation with a crafted reply built from, or instead of, its honest one. Every
run must finish; the reply is refused and counted by reason (at the relay, or by each receiver against its own
model), and the honest peers' models stay finite with the relay's push-sum ledger conserved.
"""

import logging
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Error, Message, MetricRecord, RecordDict

from asyncfl.client_app.app import gossip_data
from asyncfl.client_app.gossip import gossip_event, push_check
from asyncfl.client_app.task import node_model
from asyncfl.config import parse_run_config
from asyncfl.decentralized.codec import CENTROIDS, INDICES, Layout
from asyncfl.decentralized.divshare import DivShare
from asyncfl.decentralized.method import read_message
from asyncfl.server_app.relay import MAX_FAILED_EVENTS, MAX_LOST_EVENTS, GossipRelay
from tests.fake_grid import FakeGrid

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
HOSTILE, PEERS = 101, 4


def run_with_hostile_peer(tmp_path, method, attack, grid_class=FakeGrid, relay_checks=False, replies=None,
                          **overrides):
    """The relay over ``PEERS`` real peers, peer 0 replying ``attack(message, honest_reply_fn)``; honest peers'
    exceptions become error replies, as Flower's runtime makes them; each honest ``(request, reply)`` is appended to
    ``replies`` when given. Returns the relay, the honest peers' contexts and the honest peers' errors."""
    run_config = {**DEFAULTS, "strategy": method, "dataset": "digits", "model": "mlp", "optimizer": "sgd", "lr": 0.05,
                  "local-steps": 2, "max-time": 6.0, "gossip.eval-points": 3, "gossip.out-degree": 2,
                  "gossip.buffer-capacity": 2, "gossip.delayed-fraction": 0.0, "pushcen.k": 6, "timeout": 1.0,
                  "delay-model": "fedrevive-default", **overrides}
    cfg = parse_run_config(run_config)
    contexts = {101 + i: Context(run_id=1, node_id=101 + i, node_config={"partition-id": i, "num-partitions": PEERS},
                                 state=RecordDict(), run_config=run_config) for i in range(PEERS)}
    honest_errors = []

    def honest(node, message):
        context = contexts[node]
        data = gossip_data(cfg, int(context.node_config["partition-id"]), PEERS)
        return gossip_event(message, context, cfg, data, node_model(cfg.data, data, cfg.options.seed))

    def handler(node, message):
        if node == HOSTILE:
            return attack(message, lambda: honest(node, message))
        try:
            reply = honest(node, message)
            if replies is not None:
                replies.append((message, reply))
            return reply
        except Exception as error:  # what Flower's ClientApp runtime replies
            honest_errors.append(repr(error))
            return Message(Error(code=0, reason=repr(error)), reply_to=message)

    grid = grid_class(PEERS, handler)
    # relay_checks: the relay runs the receivers' check on each push itself, as the built-in ServerApp has it do;
    # off, what a hostile push does reaches the receivers, whose own check is then what is tested
    initial_model = node_model(cfg.data, gossip_data(cfg, 0, PEERS), cfg.options.seed)
    check = push_check(cfg, initial_model) if relay_checks else None
    relay = GossipRelay(grid, cfg.strategy, cfg.gossip, cfg.options, cfg.timeout, cfg.train.to_message_config(),
                        tmp_path / method, check_push=check)
    relay.run()
    return relay, {n: c for n, c in contexts.items() if n != HOSTILE}, honest_errors


def with_metrics(message, reply, **metrics):
    """``reply`` with some metrics replaced."""
    content = RecordDict({"metrics": MetricRecord({**dict(reply.content.metric_records["metrics"]), **metrics})})
    for name, record in reply.content.array_records.items():
        content[name] = record
    return Message(content, reply_to=message)


def with_push(message, reply, name, record):
    content = RecordDict({"metrics": reply.content.metric_records["metrics"], name: record})
    return Message(content, reply_to=message)


def nan_copy(record):
    return ArrayRecord({k: Array(np.full_like(a.numpy(), np.nan) if a.numpy().dtype.kind == "f" else a.numpy())
                        for k, a in record.items()})


def assert_honest_peers_intact(relay, contexts, honest_errors):
    assert honest_errors == []
    for context in contexts.values():
        for array in context.state.array_records["gossip-model"].values():
            assert np.isfinite(array.numpy()).all()
    ledger = sum(relay.in_flight[i].mass if i in relay.in_flight else relay.mass[i] for i in range(PEERS))
    buffered = sum(e.mass for b in relay.buffers for e in b.entries()) + sum(relay.absorbed)
    pending = sum(payload[2] for _, _, kind, _, payload in relay._events if kind == "deliver")
    assert ledger + buffered + pending + relay.stats.mass_unsent == pytest.approx(PEERS, abs=1e-9)
    summary = relay.summary()
    assert summary["final-mean-accuracy"] is not None and 0.0 <= summary["final-mean-accuracy"] <= 1.0


RELAY_REFUSES = {
    "blank error reason": ("pushcen", lambda m, honest: Message(Error(code=0, reason="  \n"), reply_to=m),
                           "error-reply"),
    "accuracy as a list": ("pushcen", lambda m, honest: with_metrics(m, honest(), **{"local-acc": [0.5]}),
                           "bad-metric"),
    "accuracy 1e300": ("async-dfedavg", lambda m, honest: with_metrics(m, honest(), **{"local-acc": 1e300}),
                       "bad-metric"),
    "a negative refused count": ("swift", lambda m, honest: with_metrics(m, honest(), **{"refused-messages": -1}),
                                 "bad-metric"),
    "NaN model (async-dfedavg)": ("async-dfedavg", lambda m, honest: with_push(
        m, honest(), "push", nan_copy(honest().content.array_records["push"])), "non-finite"),
    "NaN centroids (pushcen)": ("pushcen", lambda m, honest: with_push(
        m, honest(), "push", nan_copy(honest().content.array_records["push"])), "non-finite"),
    "text in a push": ("swift", lambda m, honest: with_push(
        m, honest(), "push", ArrayRecord({"x": Array(np.array(["a"]))})), "non-numeric-array"),
    "no reply at all": ("pushcen", lambda m, honest: None, "lost"),
}


@pytest.mark.parametrize("attack", list(RELAY_REFUSES))
def test_the_relay_refuses_counts_and_benches_a_peer_whose_replies_it_cannot_take(tmp_path, attack):
    method, craft, reason = RELAY_REFUSES[attack]
    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, method, craft)
    summary = relay.summary()
    assert summary["rejected-by-reason"] == {reason: MAX_FAILED_EVENTS}
    assert summary["benched-peers"] == [0]  # never activated again, never sent to
    assert all(payload[0] != 0 for _, _, kind, _, payload in relay._events if kind == "deliver")
    assert_honest_peers_intact(relay, contexts, honest_errors)


def _reversed_centroids(record):
    return ArrayRecord({k: Array(a.numpy()[::-1].copy() if k.endswith(CENTROIDS) else a.numpy())
                        for k, a in record.items()})


RECEIVERS_REFUSES = {
    "a push of the wrong names": ("pushcen", lambda m, honest: with_push(
        m, honest(), "push", ArrayRecord({"x": Array(np.zeros(1, np.float32))}))),
    "centroids out of order": ("pushcen", lambda m, honest: with_push(
        m, honest(), "push", _reversed_centroids(honest().content.array_records["push"]))),
    "a model of the wrong shape": ("async-dfedavg", lambda m, honest: with_push(
        m, honest(), "push", ArrayRecord({k: Array(np.zeros(3, np.float32))
                                          for k in honest().content.array_records["push"]}))),
    "a fragment count of 10**9": ("divshare", lambda m, honest: Message(RecordDict({
        "metrics": honest().content.metric_records["metrics"],
        **{name: ArrayRecord({"values": Array(np.zeros(0, np.float32)),
                              "fragment": Array(np.array([0, 0, 10**9], np.int64))})
           for name in honest().content.array_records}}), reply_to=m)),
}


@pytest.mark.parametrize("attack", list(RECEIVERS_REFUSES))
def test_honest_receivers_refuse_what_does_not_fit_their_model_and_keep_training(tmp_path, attack):
    method, craft = RECEIVERS_REFUSES[attack]
    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, method, craft)
    summary = relay.summary()
    assert summary["messages-refused-by-peers"] > 0 and summary["benched-peers"] == []
    assert_honest_peers_intact(relay, contexts, honest_errors)


@pytest.mark.parametrize("attack", list(RECEIVERS_REFUSES) + ["values near float32's limit"])
def test_with_the_receivers_check_at_the_relay_a_bad_push_is_refused_once_and_counted_against_its_sender(
        tmp_path, attack):
    method, craft = RECEIVERS_REFUSES.get(attack, ("pushcen", None))
    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, method, craft or _huge_reply, relay_checks=True)
    summary = relay.summary()
    (reason, count), = summary["rejected-by-reason"].items()
    assert reason.startswith("push-") and count == MAX_FAILED_EVENTS and summary["benched-peers"] == [0]
    assert summary["messages-refused-by-peers"] == 0  # nothing bad was forwarded
    assert_honest_peers_intact(relay, contexts, honest_errors)


def test_the_relays_check_lets_every_honest_push_through(tmp_path):
    for method in ("pushcen", "async-dfedavg", "swift", "divshare"):
        relay, contexts, honest_errors = run_with_hostile_peer(tmp_path / method, method, lambda m, honest: honest(),
                                                               relay_checks=True)
        assert relay.summary()["rejected-by-reason"] == {} and relay.summary()["pushes"] > 0, method
        assert_honest_peers_intact(relay, contexts, honest_errors)


def test_a_claimed_mass_is_not_read_the_relay_keeps_the_ledger(tmp_path):
    relay, contexts, honest_errors = run_with_hostile_peer(
        tmp_path, "pushcen", lambda m, honest: with_metrics(m, honest(), **{"mass-share": 1e308}))
    assert relay.summary()["rejected-by-reason"] == {}
    assert max(relay.mass) <= PEERS
    assert_honest_peers_intact(relay, contexts, honest_errors)


def test_a_push_the_superlink_refuses_fails_that_event_only(tmp_path):
    class Refusing(FakeGrid):
        def push_messages(self, messages):
            if messages[0].metadata.dst_node_id == HOSTILE:
                return []  # e.g. HTTP 413: Flower's Grid returns no id for a message it did not take
            return super().push_messages(messages)

    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, "pushcen", None, grid_class=Refusing)
    assert relay.summary()["rejected-by-reason"] == {"push-refused": MAX_FAILED_EVENTS}
    assert_honest_peers_intact(relay, contexts, honest_errors)


def _huge(record):
    """Every float of a push as large as float32 holds (PushCen's centroids kept ascending and non-zero)."""
    arrays = {}
    for name, array in record.items():
        values = array.numpy()
        if values.dtype.kind == "f":
            values = (np.linspace(1e38, 3e38, values.size) if name.endswith(CENTROIDS)
                      else np.full(values.size, 3e38)).astype(values.dtype).reshape(values.shape)
        arrays[name] = Array(values)
    return ArrayRecord(arrays)


def _huge_reply(message, honest):
    reply = honest()
    content = RecordDict({"metrics": reply.content.metric_records["metrics"]})
    for name, record in reply.content.array_records.items():
        content[name] = _huge(record)
    return Message(content, reply_to=message)


@pytest.mark.parametrize("method", ["pushcen", "async-dfedavg", "swift", "divshare"])
def test_finite_values_too_large_to_train_on_are_dropped_by_the_receiver_not_trained_into_nan(tmp_path, method):
    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, method, _huge_reply)
    summary = relay.summary()
    assert summary["messages-refused-by-peers"] > 0 and summary["benched-peers"] == []
    assert summary["rejected-by-reason"] == {}
    assert_honest_peers_intact(relay, contexts, honest_errors)


def test_a_peer_that_never_pushes_keeps_only_its_push_sum_share(tmp_path):
    def sink(message, honest):
        reply = honest()
        return Message(RecordDict({"metrics": reply.content.metric_records["metrics"]}), reply_to=message)

    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, "pushcen", sink)
    summary = relay.summary()
    assert relay.mass[0] <= 1.0 / 3 + 1e-12  # 1 / (out-degree + 1) of at most everything it ever held
    assert summary["mass-unsent"] > 0 and summary["rejected-by-reason"] == {}
    assert_honest_peers_intact(relay, contexts, honest_errors)


def test_lost_events_bench_a_peer_even_between_good_replies(tmp_path):
    replies = iter(range(10**6))

    def two_lost_one_good(message, honest):
        return honest() if next(replies) % 3 == 2 else None

    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, "pushcen", two_lost_one_good, **{"max-time": 9.0})
    summary = relay.summary()
    assert summary["rejected-by-reason"] == {"lost": MAX_LOST_EVENTS} and summary["benched-peers"] == [0]
    assert_honest_peers_intact(relay, contexts, honest_errors)


def test_a_request_too_large_for_the_superlink_goes_again_without_its_messages(tmp_path):
    class RefusesMessagesFor102(FakeGrid):
        def push_messages(self, messages):
            message = messages[0]
            if message.metadata.dst_node_id == 102 and any(k.startswith("msg-") for k in message.content.keys()):
                return []  # what Flower's Grid returns for a request it did not take (e.g. HTTP 413)
            return super().push_messages(messages)

    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, "pushcen", lambda m, honest: honest(),
                                                           grid_class=RefusesMessagesFor102)
    summary = relay.summary()
    assert summary["requests-refused"] > 0
    assert summary["rejected-by-reason"] == {} and summary["benched-peers"] == []
    assert_honest_peers_intact(relay, contexts, honest_errors)


def _at_the_limit(message, honest):
    """The honest reply with every pushed value 999: within the receivers' magnitude limit, too large to train on."""
    reply = honest()
    content = RecordDict({"metrics": reply.content.metric_records["metrics"]})
    content["push"] = ArrayRecord({k: Array(np.full_like(a.numpy(), 999.0))
                                   for k, a in reply.content.array_records["push"].items()})
    return Message(content, reply_to=message)


def _one_large_centroid(message, honest):
    """The honest PushCen reply with each clustered layer's table tiny but for its last centroid, 3, on which
    every index lands: a small table (the floats on the wire), a whole layer of 3 decoded."""
    reply = honest()
    arrays = {}
    for name, array in reply.content.array_records["push"].items():
        values = array.numpy()
        if name.endswith(CENTROIDS):
            values = np.append(np.linspace(1e-4, 2e-4, values.size - 1), 3.0).astype(values.dtype)
        elif name.endswith(INDICES):
            values = np.full_like(values, 0xFF)  # every index at the table's last entry (k = 4: 2 bits, 11)
        arrays[name] = Array(values)
    content = RecordDict({"metrics": reply.content.metric_records["metrics"], "push": ArrayRecord(arrays)})
    return Message(content, reply_to=message)


@pytest.mark.parametrize("method,attack,overrides", [
    ("async-dfedavg", _at_the_limit, {}),
    ("pushcen", _one_large_centroid, {"pushcen.k": 4}),
])
def test_a_message_too_large_to_train_on_costs_its_receiver_only_itself_not_its_co_delivered_honest_ones(
        tmp_path, method, attack, overrides):
    """A model that leaves the bounds is trained again without the messages of the sender farthest from it before
    every message is dropped. Before, an event that refused the hostile message refused its honest company too."""
    replies = []
    relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, method, attack, replies=replies,
                                                           model="lenet5", dataset="mnist5k",
                                                           **{"max-time": 8.0, **overrides})
    company_kept, company_lost = 0, 0  # events with hostile and honest messages that refused some
    for request, reply in replies:
        config = request.content.config_records["config"]
        senders = list(config["senders"])[: int(config["received"])]
        refused = int(reply.content.metric_records["metrics"]["refused-messages"])
        hostile = senders.count(0)
        if method == "async-dfedavg":  # 999 everywhere is always the farthest: never an honest message refused
            assert refused <= hostile
        if hostile and len(senders) > hostile and refused:
            company_kept += refused <= hostile
            company_lost += refused > hostile
    # under PushCen an honest neighbour that took some of the hostile layers in can be farther still (the docs say so)
    assert company_kept > company_lost
    assert relay.summary()["rejected-by-reason"] == {} and relay.summary()["benched-peers"] == []
    assert_honest_peers_intact(relay, contexts, honest_errors)


def test_a_stored_model_that_cannot_be_trained_restarts_from_the_model_the_peer_last_trained(tmp_path, caplog):
    """SWIFT stores its merged model untrained, so values within the magnitude limit (999 everywhere, pushed every
    event) can make a receiver's next training leave the bounds even from its own stored model; the peer then
    starts again from the model its last event trained (before that merge), its cache dropped, instead of failing
    every event and being benched, or losing its progress to the initial model."""
    gossip_log = logging.getLogger("asyncfl.gossip")  # asyncfl's loggers do not propagate to the root's
    gossip_log.addHandler(caplog.handler)
    try:
        relay, contexts, honest_errors = run_with_hostile_peer(tmp_path, "swift", _at_the_limit, model="lenet5",
                                                               dataset="mnist5k", **{"max-time": 6.0})
    finally:
        gossip_log.removeHandler(caplog.handler)
    assert "stayed within the bounds restarting from the model it last trained" in caplog.text
    assert "without" not in caplog.text  # SWIFT trains before it merges: no retry with fewer messages
    assert "restarting from the initial model" not in caplog.text and relay.summary()["peer-restarts"] > 0
    assert relay.summary()["rejected-by-reason"] == {} and relay.summary()["benched-peers"] == []
    assert_honest_peers_intact(relay, contexts, honest_errors)


def test_a_header_that_lies_about_an_arrays_size_does_not_get_it_decoded():
    """Flower decodes an array's bytes, not its header: the bytes are bounded by the schema before decoding."""
    cfg = parse_run_config({**DEFAULTS, "strategy": "divshare", "max-time": 5.0, "dataset": "digits", "model": "mlp"})
    layout = Layout.of(node_model(cfg.data, gossip_data(cfg, 0, 2), 0))
    shared = [n for n, kind in layout.kinds.items() if kind != "local"]
    honest = Array(np.zeros(10, np.float32))
    lying = Array(dtype="float32", shape=(10,), stype=honest.stype, data=Array(np.zeros(10**6, np.float32)).data)
    fragment = Array(np.array([0, 0, 2], np.int64))
    assert read_message(ArrayRecord({"values": honest, "fragment": fragment}), DivShare(), layout, shared,
                        cfg.gossip)[1] == "fragment"  # the header pre-check lets an honest-sized array through
    assert read_message(ArrayRecord({"values": lying, "fragment": fragment}), DivShare(), layout, shared,
                        cfg.gossip) == (None, "dtype-or-shape")
