"""A Grid that runs a real ClientApp in this process: Flower's strategies and ours on the same app, fast.

For studies and tests that need many seeded runs of an app on a small machine (the drop-in
study compares Flower's own ``FedAvg`` with every asyncfl strategy at equal client work):
through ``flwr run`` each run pays a SuperLink, Ray and one process
per message; here every message goes straight to the app's ``ClientApp`` (its
``@app.train`` / ``@app.evaluate`` functions, unchanged) with a per-node ``Context``, and the
reply is ready when the push returns. Use the virtual clock with it (replies are all back at
once, so the wall clock's arrival order would be the push order). It serves both interfaces a
ServerApp uses: ``send_and_receive`` (Flower's synchronous strategies) and
``push_messages`` / ``pull_messages`` (asyncfl's engine, whose virtual clock orders replies
itself). A ClientApp that raises becomes an error reply, as under Flower's runtime.
"""

from __future__ import annotations

import itertools

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

FIRST_NODE_ID = 1001


class InProcessGrid:
    """``num_nodes`` nodes running ``client_app``; node ``i`` has ``partition-id = i``.

    Parameters
    ----------
    client_app : ClientApp
        The app's ClientApp object, as its ``client_app.py`` defines it.
    num_nodes : int
        Simulated nodes (``num-partitions``).
    run_config : dict
        What ``context.run_config`` holds on every node.
    drill : (str, int), optional
        An attack drill, ``(attack, attackers)``: the train replies of partitions ``0 .. attackers-1`` are
        poisoned as :mod:`asyncfl.client_app.drills` says (``"noise"``, ``"sign-flip"``, ``"scale"``, ...),
        whatever the app's ClientApp is, so a defence can be measured on any app.
    """

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: dict, drill: tuple[str, int] = ("", 0)
                 ) -> None:
        self.client_app = client_app
        self.drill = drill
        # what Flower's runtime sets in a ServerApp process; Message() reads it
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.nodes = list(range(FIRST_NODE_ID, FIRST_NODE_ID + num_nodes))
        self._contexts = {
            node: Context(run_id=1, node_id=node, node_config={"partition-id": i, "num-partitions": num_nodes},
                          state=RecordDict(), run_config=dict(run_config))
            for i, node in enumerate(self.nodes)}
        self._ids = itertools.count()
        self._replies: dict[str, Message] = {}
        self.messages_by_type: dict[str, int] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages) -> list[str]:
        ids = []
        for message in messages:
            message_id = f"m{next(self._ids)}"
            message.metadata.__dict__["_message_id"] = message_id  # what the SuperLink assigns on push
            node = message.metadata.dst_node_id
            kind = message.metadata.message_type
            self.messages_by_type[kind] = self.messages_by_type.get(kind, 0) + 1
            try:
                reply = self.client_app(message, self._contexts[node])
            except Exception as exc:  # noqa: BLE001 - any ClientApp failure is an error reply, as in Flower
                reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=message)
            if kind == "train" and self.nodes.index(node) < self.drill[1] and not reply.has_error():
                reply = self._poisoned(message, reply, message_id)
            reply.metadata.__dict__["_src_node_id"] = node
            self._replies[message_id] = reply
            ids.append(message_id)
        return ids

    def _poisoned(self, request: Message, reply: Message, message_id: str) -> Message:
        """``reply`` as a node making the drill's attack returns it (seeded by the job's seed, else the message)."""
        from asyncfl import protocol
        from asyncfl.client_app.drills import apply_fault, reported_examples

        config = request.content.config_records.get("config", {})
        seed = int(config.get(protocol.JOB_SEED, int(message_id[1:])))
        try:
            arrays = apply_fault(self.drill[0], reply.content.array_records["arrays"],
                                 request.content.array_records["arrays"], seed)
        except Exception as exc:  # noqa: BLE001 - the "error" drill, as the ClientApp raising would be
            return Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=request)
        content = RecordDict({**reply.content, "arrays": arrays})
        metrics = protocol.reply_metrics(content)
        if metrics is not None and protocol.NUM_EXAMPLES in metrics:
            metrics[protocol.NUM_EXAMPLES] = reported_examples(self.drill[0], int(metrics[protocol.NUM_EXAMPLES]))
        return Message(content, reply_to=request)

    def pull_messages(self, message_ids) -> list[Message]:
        return [self._replies.pop(mid) for mid in list(message_ids) if mid in self._replies]

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(list(messages)))
