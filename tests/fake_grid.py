"""A fake Grid: replies are computed at push time and released in a chosen physical order.

It follows the Grid contract the engine relies on: ``push_messages`` returns
one id per accepted message, ``pull_messages`` is destructive and returns only
replies that are already "back".
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable

from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict

Handler = Callable[[int, Message], Message | None]


class FakeGrid:
    """Nodes ``1..num_nodes``; ``handler(node_id, message)`` builds a reply or ``None`` (lost).

    ``release`` decides which replies each pull returns: it gets the list of
    waiting message ids in push order and returns those to deliver now.
    """

    def __init__(self, num_nodes: int, handler: Handler, release=None, partition_ids: bool = True,
                 sizes: list[int] | None = None, label_counts: list[list[int]] | None = None) -> None:
        self.nodes = list(range(101, 101 + num_nodes))
        self.sizes = sizes
        self.label_counts = label_counts
        self.handler = handler
        self.release = release or (lambda waiting: waiting)
        self.partition_ids = partition_ids
        self._ids = itertools.count()
        self._waiting: dict[str, Message] = {}
        self.pushed: list[Message] = []
        self.pull_calls = 0
        self._lock = threading.RLock()  # the engine pulls from worker threads in wall-clock runs

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        with self._lock:
            return self._push(messages)

    def _push(self, messages):
        ids = []
        for message in messages:
            message_id = f"m{next(self._ids)}"
            message.metadata.__dict__["_message_id"] = message_id
            self.pushed.append(message)
            node = message.metadata.dst_node_id
            if message.metadata.message_type == "query":
                reply = self._identify(node, message)
            else:
                reply = self.handler(node, message)
            if reply is not None:
                reply.metadata.__dict__["_src_node_id"] = node
                self._waiting[message_id] = reply
            ids.append(message_id)
        return ids

    def _identify(self, node: int, message: Message) -> Message:
        if not self.partition_ids:
            return Message(Error(code=0, reason="no query handler"), reply_to=message)
        from flwr.app import ConfigRecord

        identity = {"partition-id": self.nodes.index(node)}
        if self.sizes is not None:
            identity["num-examples"] = self.sizes[self.nodes.index(node)]
        asked = message.content.config_records["config"].get("asyncfl-label-counts", False)
        if asked and self.label_counts is not None:
            identity["label-counts"] = list(self.label_counts[self.nodes.index(node)])
        return Message(RecordDict({"config": ConfigRecord(identity)}), reply_to=message)

    def pull_messages(self, message_ids):
        with self._lock:
            return self._pull(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        """Flower's synchronous call (a custom loop's): every reply that is not lost."""
        with self._lock:
            return self._pull(self._push(list(messages)))

    def _pull(self, message_ids):
        self.pull_calls += 1
        wanted = [mid for mid in self._waiting if mid in set(message_ids)]
        out = []
        for mid in self.release(wanted):
            out.append(self._waiting.pop(mid))
        return out


def trained_reply(message: Message, arrays: ArrayRecord, num_examples: int = 10, loss: float = 0.5) -> Message:
    """A well-formed train reply carrying ``arrays``."""
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": num_examples, "train-loss": loss})})
    return Message(content, reply_to=message)
