"""An asyncfl strategy inside a Flower app's own loop: each round's replies through the method's math.

Some Flower apps override ``start`` with a loop of their own (Flower's ``advanced-pytorch``
example: ``configure_train`` -> ``grid.send_and_receive`` -> ``aggregate_train`` -> ...). Such a
loop is synchronous: every node it sampled trains from the same model and the round waits for
all of them. An asyncfl strategy in it keeps Flower's contract: ``configure_train`` samples
``fraction_train`` of the nodes, as Flower's ``FedAvg`` does, without writing into the caller's
config record, and ``aggregate_train`` hands the round's replies, in order, to the method's
``on_arrival`` with staleness 0 (all trained from the round's model) and returns the model it
made (a synchronous method's at the round's end, ``on_round_end``), with the replies' train
metrics aggregated as Flower's. For asynchronous training, call ``start`` (with callbacks for
what the loop did around it).
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Iterable

import numpy as np
from flwr.common.logger import log as flwr_log

from asyncfl import protocol
from asyncfl.strategies.arrival import Arrival

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord

    from asyncfl.strategies.base import Strategy



class SynchronousRounds:
    """The state a custom loop needs between ``configure_train`` and ``aggregate_train``: the round's model."""

    def __init__(self, strategy: "Strategy") -> None:
        self.strategy = strategy
        self.codec = None
        self.model: np.ndarray | None = None
        self.started = False
        self.nodes = 0  # the most nodes a round was sampled from
        self.cohort = 0  # how many nodes the first round sampled: the method's K (its automatic buffer and pace)
        self.bounds = None  # the per-participant bounds, built at the first round's replies
        self._rng = random.Random(0)

    def sample(self, grid, fraction: float, minimum: int) -> tuple[list[int], int]:
        """Flower's ``FedAvg`` sample: ``max(minimum, int(fraction * nodes))`` of the connected nodes (none at fraction
        0), once ``min_available_nodes`` and that many are connected (as Flower waits for them); drawn from a seeded
        generator. Returns the sample and how many nodes were connected."""
        nodes = list(grid.get_node_ids())
        if fraction == 0.0:
            return [], len(nodes)
        size = max(minimum, int(len(nodes) * fraction))
        wanted = max(self.strategy.flower.min_available_nodes, size)
        while len(nodes) < wanted:
            flwr_log(logging.INFO, "Waiting for nodes to connect: %d connected (minimum required: %d).", len(nodes),
                     wanted)
            time.sleep(1.0)
            nodes = list(grid.get_node_ids())
        return sorted(self._rng.sample(sorted(nodes), size)), len(nodes)

    def remember(self, arrays: "ArrayRecord", nodes: int, cohort: int) -> None:
        """The model this round's requests carry (what every reply of the round trained from), sent to ``cohort`` of
        ``nodes`` nodes; its layout is the run's (the bounds and the method's state are per entry)."""
        from asyncfl.errors import ConfigError
        from asyncfl.server_app.launch import codec_and_model

        if self.codec is None and getattr(self.strategy, "true_proportions", None) is not None:
            raise ConfigError(f"{type(self.strategy).__name__} in an app's own loop: its label histograms "
                              "(true_proportions / label_proportions) take partition ids, which such a loop does not "
                              "learn (its client indices are Flower's node ids); call start(), which identifies the "
                              "nodes, or leave them out")
        codec, self.model = codec_and_model(arrays)
        layout = (codec.names, codec.shapes, [str(d) for d in codec.dtypes])
        if self.codec is not None and layout != (self.codec.names, self.codec.shapes,
                                                 [str(d) for d in self.codec.dtypes]):
            raise ConfigError(f"{type(self.strategy).__name__} in an app's own loop: the model's layout changed "
                              f"between rounds ({len(self.codec.names)} arrays, now {len(codec.names)}, or their "
                              "names, shapes or dtypes); one run keeps one layout: a new model needs a new strategy")
        self.codec = codec
        self.nodes = max(self.nodes, nodes)
        self.cohort = self.cohort or cohort

    def _participant_bounds(self):
        """The per-participant bounds ``start()`` applies by default (:class:`~asyncfl.options.RunOptions`'
        ``update_norm_bound`` and ``update_norm_action``): each reply's count capped at the ceiling and its update's
        movement bounded, per node. None under the DP wrapper, whose fixed clip bounds every update (the adaptive
        bound's median of other nodes' norms would escape the noise), as in ``start()``."""
        from types import SimpleNamespace

        from asyncfl.options import RunOptions
        from asyncfl.server_app.participants import ParticipantBounds

        options = RunOptions()
        if not getattr(self.strategy, "participant_bounds", True) or not options.update_norm_bound:
            return None
        # the loop, not the node, decides how often a node trains: no dispatch to hold one back, no bound by its rate
        bounds = ParticipantBounds(options.update_norm_bound, options.update_norm_action, self.codec.bound_groups(),
                                   SimpleNamespace(held_back_checks=0), self.strategy, by_rate=False)
        bounds.start([0] * self.nodes)  # no sizes reported: the first counts pass until 3 nodes are known
        return bounds

    def _held(self) -> tuple[int, int]:
        """How many updates the bounds clipped and counts they capped so far."""
        return (self.bounds.norm.clipped, self.bounds.count.capped) if self.bounds is not None else (0, 0)

    def aggregate(self, server_round: int, replies: Iterable["Message"]) -> tuple["ArrayRecord | None",
                                                                                "MetricRecord | None"]:
        """The round's replies through the strategy's ``on_arrival``, staleness 0; Flower's return shape."""
        from flwr.app import MetricRecord, RecordDict

        from asyncfl.server_app.client_metrics import aggregate_replies
        from asyncfl.server_app.codec import RejectedReply, read_train_reply, reported_count, reported_loss

        strategy = self.strategy
        if self.model is None:
            raise RuntimeError(f"{type(strategy).__name__}.aggregate_train: call configure_train first (it "
                               "remembers the model the round's nodes train from)")
        replies = list(replies)
        if not self.started:
            strategy.on_start(num_clients=max(1, self.nodes), concurrency=max(1, self.cohort or len(replies)))
            self.started = True
            self.bounds = self._participant_bounds()
            # on Flower's logger, as the loop's own lines: a custom loop never configures asyncfl's
            flwr_log(logging.INFO, "%s in a custom loop runs synchronously: each round's replies go through its "
                     "update rule with staleness 0; call start() for asynchronous training", type(strategy).__name__)
        keys, weight_key = strategy.flower.keys, strategy.flower.weighted_by_key
        current, accepted, taken = self.model, [], 0
        held_before = self._held()
        for index, reply in enumerate(replies):
            # a reply is a participant's data: its model and its count are checked as the engine checks them
            # (a count that is no whole number from 0 to 2**53 rejects the reply), its loss read or NaN, its
            # update bounded as start() bounds it
            try:
                weights = read_train_reply(reply, self.codec, keys)
                metrics = protocol.reply_metrics(reply.content)
                examples = reported_count(metrics, weight_key) if metrics is not None and weight_key in metrics else 1
                if isinstance(examples, RejectedReply):
                    raise examples
                arrival = Arrival(int(reply.metadata.src_node_id), server_round - 1, 0, weights, self.model,
                                  examples, reported_loss(metrics), float(server_round))
                arrival = self.bounds.apply(arrival) if self.bounds is not None else arrival
                if isinstance(arrival, RejectedReply):
                    raise arrival
            except RejectedReply as exc:
                flwr_log(logging.WARNING, "round %d: reply %d rejected (%s): %s", server_round, index, exc.reason, exc)
                continue
            taken += 1
            current = self._stepped(strategy.on_arrival(arrival, current), current, server_round)
            # the train metrics are aggregated weighted by the count as checked and capped (absent: 1)
            if metrics is not None:
                accepted.append(RecordDict({"metrics": MetricRecord({**metrics, weight_key: arrival.num_examples})}))
        clipped, capped = (after - before for after, before in zip(self._held(), held_before))
        if clipped or capped:
            flwr_log(logging.WARNING, "round %d: the per-participant bounds clipped %d updates and capped %d example "
                     "counts (docs/security.md)", server_round, clipped, capped)
        if not taken:
            return None, None
        if strategy.synchronous:  # a synchronous method (FedAvg, ...) makes its round's model once the round is in
            current = self._stepped(strategy.on_round_end(current), current, server_round)
        metrics = aggregate_replies(accepted, strategy.flower.weighted_by_key, strategy.flower.train_metrics_aggr_fn,
                                    "train")
        return self.codec.to_record(current), metrics

    def _stepped(self, new: np.ndarray | None, current: np.ndarray, server_round: int) -> np.ndarray:
        """The model after a step of the method (``current`` when it made none), as ``start()`` takes it: refused
        when not finite (a broken step, or a reply the warm-up could not bound on an all-zero first model:
        ``docs/security.md``), BatchNorm variances clamped to >= 0
        (:meth:`~asyncfl.server_app.codec.ModelCodec.clamp_variances`)."""
        if new is None:
            return current
        if not np.isfinite(new).all():
            raise FloatingPointError(f"{type(self.strategy).__name__} produced a non-finite model in round "
                                     f"{server_round} of the app's own loop")
        return self.codec.clamp_variances(new)[0] if self.codec.variance_segments else new


def checked_evaluate_contents(server_round: int, replies: Iterable["Message"], weight_key: str) -> list:
    """A custom loop's federated-evaluation replies as ``start()`` takes them in: an error, no metrics or a count
    that is no whole number from 0 to 2**53 leaves a reply out (one warning line), and the counts are capped at
    3 x the round's median where 3 or more replies report one, so that no node's claimed count makes a metric its
    own."""
    from asyncfl.server_app.client_metrics import EVALUATE_WEIGHT_MULTIPLE, capped_weights, read_evaluate_reply

    contents = []
    for index, reply in enumerate(replies):
        content = read_evaluate_reply(reply, weight_key)
        if isinstance(content, str):
            flwr_log(logging.WARNING, "round %d: evaluate reply %d rejected (%s)", server_round, index, content)
        else:
            contents.append(content)
    capped_weights(contents, weight_key, EVALUATE_WEIGHT_MULTIPLE)
    return contents


def _messages(strategy: "Strategy", arrays: "ArrayRecord", config: "ConfigRecord", server_round: int,
              nodes: list[int], message_type: str) -> list["Message"]:
    from flwr.app import ConfigRecord, Message, RecordDict

    from asyncfl import protocol

    sent = ConfigRecord({**dict(config), protocol.SERVER_ROUND: server_round})  # the caller's record stays as it was
    content = RecordDict({strategy.flower.arrayrecord_key: arrays, strategy.flower.configrecord_key: sent})
    return [Message(content, dst_node_id=node, message_type=message_type) for node in nodes]


def configure_train_messages(strategy: "Strategy", rounds: SynchronousRounds, server_round: int,
                             arrays: "ArrayRecord", config: "ConfigRecord", grid) -> list["Message"]:
    """A custom loop's train requests: Flower's sample of ``fraction_train`` of the nodes, each with a copy of
    ``config`` plus ``server-round``; the round's model is remembered for :meth:`SynchronousRounds.aggregate`."""
    from flwr.common import MessageType

    nodes, connected = rounds.sample(grid, strategy.flower.fraction_train, strategy.flower.min_train_nodes)
    rounds.remember(arrays, connected, len(nodes))
    flwr_log(logging.INFO, "configure_train: sampled %d nodes (out of %d)", len(nodes), connected)
    return _messages(strategy, arrays, config, server_round, nodes, MessageType.TRAIN)


def evaluate_messages(strategy: "Strategy", rounds: SynchronousRounds, server_round: int, arrays: "ArrayRecord",
                      config: "ConfigRecord", grid) -> list["Message"]:
    """A custom loop's evaluation requests: Flower's sample of ``fraction_evaluate`` of the nodes (none at 0)."""
    from flwr.common import MessageType

    nodes, _ = rounds.sample(grid, strategy.flower.fraction_evaluate, strategy.flower.min_evaluate_nodes)
    return _messages(strategy, arrays, config, server_round, nodes, MessageType.EVALUATE)
