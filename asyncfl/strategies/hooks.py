"""Flower's strategy hooks on an asyncfl strategy: what the engine calls, and what a Flower app's own loop calls.

One piece of :class:`asyncfl.strategies.base.Strategy`. Inside :meth:`Strategy.start` the engine
calls ``configure_train`` once per round of client work (for the round's config) and
``configure_evaluate`` / ``aggregate_evaluate`` at each federated evaluation point; FedBuff and the
FedAvg preset call an ``aggregate_train`` override at each aggregation (:mod:`asyncfl.strategies.train_hook`),
and an override that a run would never call is refused before it starts
(:func:`~asyncfl.strategies.train_hook.check_overrides`). A Flower app that overrides ``start`` with its
own loop gets Flower's contract (:mod:`asyncfl.strategies.custom_loop`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.serverapp import Grid

    from asyncfl.strategies.train_hook import TrainHook


class FlowerHooks:
    """Flower's ``configure_*`` / ``aggregate_*`` hooks (mixed into :class:`~asyncfl.strategies.base.Strategy`)."""

    #: Whether an ``aggregate_train`` override is called under :meth:`start` (at the method's aggregation step:
    #: FedBuff's buffer, FedAvg's round); a method that makes a model from each update alone refuses one.
    honours_aggregate_train: bool = False

    #: Set by :meth:`start` while it runs, when the class overrides ``aggregate_train`` and honours it.
    aggregation_hook: "TrainHook | None" = None

    # ------------------------------------------------------------ Flower's hooks
    def overrides(self, hook: str) -> bool:
        """Whether this strategy's class overrides ``hook`` (a Flower hook the engine then calls; it skips
        building requests for one that is not overridden)."""
        return getattr(type(self), hook) is not getattr(FlowerHooks, hook)

    @classmethod
    def overrides_aggregate_train(cls) -> bool:
        """Whether the class overrides Flower's ``aggregate_train`` (:attr:`honours_aggregate_train`)."""
        return cls.aggregate_train is not FlowerHooks.aggregate_train

    def _aggregate_train_refusal(self) -> str:
        """Why :func:`~asyncfl.strategies.train_hook.check_overrides` refuses this class's ``aggregate_train``
        override where it does not :attr:`honour <honours_aggregate_train>` one (one line)."""
        name = type(self).__name__
        return (f"{name} overrides aggregate_train, which start() cannot call: {name} makes a new model from each "
                "update as it arrives, with no round of replies to aggregate. Override on_arrival(arrival, current) "
                "for your own aggregation (docs/library.md, 'Write your own asynchronous strategy'), or subclass "
                "FedBuff, whose buffer step calls aggregate_train; to log or save models, pass callbacks=")

    def configure_train(self, server_round: int, arrays: "ArrayRecord", config: "ConfigRecord",
                        grid: "Grid") -> "Iterable[Message]":
        """Flower's hook: the train requests of round ``server_round``, one per node.

        Called as Flower calls it: once per round of client work (see :meth:`start`'s
        ``num_rounds``), when the round's first job is dispatched, with the global model then
        in effect and the same ``train_config`` record every round (so an override that
        changes it in place, e.g. halving ``config["lr"]`` every 5 rounds, changes it for good,
        as under Flower's ``FedAvg``). Every job of the round carries the config of the
        returned message addressed to its node (or of the first message, for a node without
        one); the engine adds ``model-version``, ``job-seed`` and ``dispatch-time``. Which
        node trains when is the engine's choice (whoever is idle), not this method's; the
        arrays of the returned messages are not used (a job carries the model version it is
        sent with).

        Called by a Flower app's own loop instead (outside :meth:`start`), it returns what Flower's
        ``FedAvg`` would: requests to ``fraction_train`` of the nodes (once ``min_available_nodes`` are
        connected), each with a copy of ``config`` plus ``server-round``, and remembers ``arrays`` as
        the round's model for :meth:`aggregate_train` (an override must call it); a model layout other
        than the first round's raises ``ConfigError`` (:mod:`asyncfl.strategies.custom_loop`).
        """
        from flwr.common import MessageType

        from asyncfl import protocol

        if not self._in_start:  # a Flower app's own loop: Flower's sample, the caller's record left as it was
            from asyncfl.strategies.custom_loop import configure_train_messages

            return configure_train_messages(self, self._custom_loop, server_round, arrays, config, grid)
        config[protocol.SERVER_ROUND] = server_round
        return self._requests(arrays, config, grid, MessageType.TRAIN)

    def aggregate_train(self, server_round: int,
                        replies: "Iterable[Message]") -> "tuple[ArrayRecord | None, MetricRecord | None]":
        """Flower's hook: replies -> the new global arrays and their train metrics.

        Under :meth:`start`, FedBuff and the FedAvg preset call an override of it at each aggregation
        (FedBuff's buffer step, FedAvg's round) with that step's replies; calling this base method
        from the override returns the method's own step over the replies it is given, with what they
        hold then (arrays the override replaced count, checked as an arriving update), and the model
        returned goes through the engine's checks (:mod:`asyncfl.strategies.train_hook`). Methods that make a model from each update alone
        refuse an override at :meth:`start`.

        Called by a Flower app's own loop instead of :meth:`start`, the round's replies are checked and
        bounded per node as :meth:`start` does, then go through the method's :meth:`on_arrival` in
        order, each with staleness 0 (they all trained from the model :meth:`configure_train` sent),
        and the model the method made comes back (``FloatingPointError`` if a step made it non-finite;
        ``(None, None)`` when no reply was taken) with the replies' train metrics aggregated as
        Flower's (:mod:`asyncfl.strategies.custom_loop`).
        """
        if self._in_start:
            if self.aggregation_hook is None:
                raise RuntimeError(f"{type(self).__name__}.aggregate_train is called by start() only where the "
                                   "class overrides it, at the method's aggregation step")
            return self.aggregation_hook.own_step(self, replies)
        return self._custom_loop.aggregate(server_round, replies)

    @property
    def _custom_loop(self):
        from asyncfl.strategies.custom_loop import SynchronousRounds

        if "_rounds" not in self.__dict__:
            self.__dict__["_rounds"] = SynchronousRounds(self)
        return self.__dict__["_rounds"]

    @property
    def _in_start(self) -> bool:
        return self.__dict__.get("_starting", False)

    def configure_evaluate(self, server_round: int, arrays: "ArrayRecord", config: "ConfigRecord",
                           grid: "Grid") -> "Iterable[Message]":
        """Flower's hook: the federated-evaluation requests of round ``server_round``, one per node.

        Called at each federated evaluation point (``fraction_evaluate > 0``) with the model in
        effect then and the same ``evaluate_config`` record every time. Each sampled node gets the
        config of the returned message addressed to it (the sample itself is the engine's, seeded);
        ``server-round`` and ``model-version`` are added. Called by a Flower app's own loop, it returns Flower's
        sample of ``fraction_evaluate`` of the nodes (:mod:`asyncfl.strategies.custom_loop`).
        """
        from flwr.common import MessageType

        if not self._in_start:  # a Flower app's own loop: Flower's sample of fraction_evaluate of the nodes
            from asyncfl.strategies.custom_loop import evaluate_messages

            return evaluate_messages(self, self._custom_loop, server_round, arrays, config, grid)
        return self._requests(arrays, config, grid, MessageType.EVALUATE)

    def _requests(self, arrays: "ArrayRecord", config: "ConfigRecord", grid: "Grid", message_type: str) -> list:
        """One ``message_type`` message per node of ``grid``, all carrying ``arrays`` and ``config`` (as Flower's
        ``FedAvg`` builds them, under this strategy's record keys)."""
        from flwr.app import Message, RecordDict

        content = RecordDict({self.flower.arrayrecord_key: arrays, self.flower.configrecord_key: config})
        return [Message(content, dst_node_id=node, message_type=message_type) for node in grid.get_node_ids()]

    def aggregate_evaluate(self, server_round: int, replies: "Iterable[Message]") -> "MetricRecord | None":
        """Flower's hook: one round's federated-evaluation replies -> its ``evaluate_metrics_clientapp`` entry.

        Default: ``evaluate_metrics_aggr_fn`` over the replies (Flower's weighted average by
        ``weighted_by_key``). Called when every reply of the point is in or lost; each reply's
        content holds its metric record under ``"metrics"``. Called by a Flower app's own loop, the
        replies are first checked as :meth:`start` checks them, their counts capped at 3 x the round's
        median where 3 or more report one (:mod:`asyncfl.strategies.custom_loop`). With the default
        aggregation a reply without the count, or with a value that is not a finite number of the
        shape most replies send, is left out of the mean (:func:`~asyncfl.server_app.client_metrics.aggregate_replies`).
        """
        from asyncfl.server_app.client_metrics import aggregate_replies

        flower = self.flower
        if self._in_start:  # checked by the engine's federated evaluation
            contents = [reply.content for reply in replies]
        else:
            from asyncfl.strategies.custom_loop import checked_evaluate_contents

            contents = checked_evaluate_contents(server_round, replies, flower.weighted_by_key)
        return aggregate_replies(contents, flower.weighted_by_key, flower.evaluate_metrics_aggr_fn, "evaluate")
