"""Who the clients are: node ids in a seed-stable order, their sizes and labels, and who is online.

Clients are ordered by the ``partition-id`` their nodes report (the identity query,
:mod:`asyncfl.server_app.discovery`), so a seeded run picks the same data whatever node
ids the SuperLink assigned; nodes that report none follow by node id. The delay sampler
is told every client's size (and label counts, when its model is tied to labels) as
clients are added. Where nodes come and go (the wall clock), :meth:`Roster.refresh`
tracks the online set and takes in nodes that joined.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from asyncfl.server_app.discovery import AskAgain, Identities, ask, query_identities, take_answers
from asyncfl.server_app.puller import ThreadedPuller
from asyncfl.server_app.transport import on_superlink

log = logging.getLogger("asyncfl.engine")

#: Seconds a node that joined mid-run is given to answer the identity query before it is taken in unidentified.
JOIN_WAIT_S = 10.0
#: Threads that pull a deployment's identity answers: as many answers whose objects never arrive hold them all.
ANSWER_PULLERS = 32
#: Seconds between looks at which nodes are online (wall clock).
REFRESH_SECONDS = 2.0


class Roster:
    """The run's clients, by client index.

    Parameters
    ----------
    grid : GridLike
        Where the nodes are.
    delays : sampler
        Told the clients' sizes (``bind_clients``); asked whether it needs label counts.
    identify : bool
        Ask nodes for their identity (off: node-id order).
    probe_first : bool
        Ask one node before the others (:func:`~asyncfl.server_app.discovery.query_identities`): a simulation's
        nodes run one ClientApp, and each refusal is a traceback in its log.

    Notes
    -----
    On Flower's deployment Grid (:func:`~asyncfl.server_app.transport.on_superlink`: SuperNodes other people may
    run) the answers are pulled message by message by background threads
    (:class:`~asyncfl.server_app.puller.ThreadedPuller`), so that an answer whose objects never arrive (Flower's
    Grid retries inside that pull until the SuperLink's object-push session expires) holds one of them, not the
    start past its deadline; elsewhere (a simulation) in paced batches on the caller's thread, one pull request per
    poll however many nodes. The answers of nodes that join mid-run (:meth:`refresh`) are always pulled by those
    threads: a look at the online nodes never waits for one.
    """

    def __init__(self, grid, delays, identify: bool, probe_first: bool = True) -> None:
        self.grid = grid
        self.delays = delays
        self.nodes: list[int] = []  # client index -> node id
        self.sizes: list[int] = []  # client index -> reported training-set size (median when unreported)
        self.index_of: dict[int, int] = {}  # node id -> client index
        # client index -> who owns its data ("partition-id:<p>" as the node reported it): what stays when a node
        # leaves and joins again under a new node id and index (the DP ledger is keyed by it)
        self.owners: dict[int, str] = {}
        self.no_data: set[int] = set()  # clients that reported an empty training set: they get no jobs
        self.online: set[int] = set()
        self.unidentified = 0  # nodes that reported no partition-id
        self.refresh_every = REFRESH_SECONDS
        self._size_of: dict[int, int] = {}
        self._labels_of: dict[int, list[int]] = {}
        self._ask = identify
        self._probe_first = probe_first
        # pulls identity answers off the engine's thread (its threads start at its first poll and end when idle)
        self._answers = ThreadedPuller(grid, workers=ANSWER_PULLERS)
        # label counts are private to clients: asked for only when the delay model is defined by them
        self._wants_label_counts = bool(getattr(delays, "needs_label_counts", False))
        self._checked = float("-inf")
        # nodes that joined mid-run, asked for their identity: node -> (query message id, when to stop waiting,
        # whether a look past that time asked for its answer once more)
        self._joining: dict[int, tuple[str, float, bool]] = {}
        self._ask_again = AskAgain(grid, self._wants_label_counts)  # a joiner whose answer was lost, once
        self.join_wait_s = JOIN_WAIT_S

    def __len__(self) -> int:
        return len(self.nodes)

    def start(self, nodes: list[int], deadline_s: float) -> None:
        """The first clients: identify ``nodes`` (waiting up to ``deadline_s``) and mark them online."""
        self.nodes, self.sizes, self._size_of, self.owners = [], [], {}, {}
        self.add(nodes, deadline_s)
        self.online, self._checked = set(nodes), time.monotonic()

    def add(self, nodes: list[int], deadline_s: float) -> None:
        """Identify ``nodes`` (waiting up to ``deadline_s``) and append them to the client order."""
        asked = self._ask
        found = (query_identities(self.grid, nodes, deadline_s, self._wants_label_counts, self._probe_first,
                                  self._answers if on_superlink(self.grid) else None) if asked else Identities())
        self._take_in(nodes, found, asked)

    def _take_in(self, nodes: list[int], found: Identities, asked: bool) -> None:
        """Append ``nodes`` to the client order (by partition id, then node id) with what ``found`` says of them."""
        unknown = [node for node in nodes if node not in found.partition_of]
        self.unidentified += len(unknown)
        if not asked:
            pass  # identify_nodes off: node-id order, as asked
        elif found.no_handler and not self.nodes:  # the first nodes (a node joining later speaks for itself)
            log.info("clients follow node-id order: the ClientApp has no query handler "
                     "(asyncfl.client_app.extras.answer_identity adds one); a seeded simulation repeats exactly only "
                     "when the nodes report their partition-id")
            self._ask = False  # nodes joining later run the same ClientApp
        elif found.refused:
            log.warning("%d of %d node(s) answered the identity query with an error; they follow in node-id order, "
                        "which the seed does not fix", found.refused, len(nodes))
        elif found.unanswered:
            log.warning("%d node(s) did not answer the identity query in time; they follow in node-id order, "
                        "which the seed does not fix: this run may not repeat exactly", len(found.unanswered))
        elif unknown:
            log.warning("%d node(s) did not report a partition-id; client order follows node ids", len(unknown))
        self.nodes += found.ordered(nodes)
        self.index_of = {node: i for i, node in enumerate(self.nodes)}
        self.owners.update({self.index_of[node]: f"partition-id:{pid}" for node, pid in found.partition_of.items()})
        self._size_of.update(found.size_of)
        self._labels_of.update(found.labels_of)
        # nodes that do not report their sample count count as median-sized for size-tied delays
        reported = [self._size_of[node] for node in self.nodes if node in self._size_of]
        fallback = int(np.median(reported)) if reported else 0
        self.sizes = [self._size_of.get(node, fallback) for node in self.nodes]
        self.no_data = {i for i, node in enumerate(self.nodes) if self._size_of.get(node) == 0}
        if self.no_data:
            log.info("%d client(s) reported no training data and get no jobs", len(self.no_data))
        if self._wants_label_counts:
            self.delays.bind_clients(self.sizes, [self._labels_of.get(node) for node in self.nodes])
        else:
            self.delays.bind_clients(self.sizes)

    def refresh(self) -> list[int]:
        """Look at who is online (at most every :attr:`refresh_every` seconds) and take in nodes that joined;
        returns the client indices whose online state changed or that are new."""
        if time.monotonic() - self._checked < self.refresh_every:
            return []
        online = set(self.grid.get_node_ids())
        changed = [self.index_of[node] for node in (online ^ self.online) & self.index_of.keys()]
        self.online, self._checked = online, time.monotonic()
        joined = sorted(online - set(self.nodes) - self._joining.keys())
        if joined and self._ask:  # asked now, taken in once they answer (or JOIN_WAIT_S passed): the run goes on
            deadline = time.monotonic() + self.join_wait_s
            self._joining.update({node: (message_id, deadline, False) for message_id, node in
                                  ask(self.grid, joined, deadline, self._wants_label_counts).items() if message_id})
            joined = []
        answered, found = self._answered_joiners() if self._joining else ([], Identities())
        ready = joined + answered
        if ready:
            known = len(self.nodes)
            self._take_in(ready, found, self._ask)
            changed += list(range(known, len(self.nodes)))
            log.info("%d node(s) joined; %d clients known", len(ready), len(self.nodes))
        return changed

    def _answered_joiners(self) -> tuple[list[int], Identities]:
        """The nodes that joined mid-run and answered the identity query (or waited past their deadline), out of those
        asked, with what they answered (a look of its own: a partition-id another node claimed earlier is not held
        against a node that rejoins). Answers are pulled by background threads between looks, so a look never waits
        for one, and a node still silent at a look past its deadline gets one look more (a pull that look asked for
        may bring an answer sent in time); an answer the SuperLink lost is asked for once more."""
        found = Identities()
        node_of = {message_id: node for node, (message_id, *_) in self._joining.items()}
        pending = set(node_of)
        lost = take_answers(self._answers.poll(list(pending)), found, pending)
        now = time.monotonic()
        for node in (node_of[message_id] for message_id in lost if message_id in node_of):
            self._answers.forget(self._joining[node][0])
            deadline = self._joining[node][1]
            if (message_id := self._ask_again(node, deadline)) is not None:
                self._joining[node] = (message_id, deadline, False)
                pending.add(message_id)
        ready = []
        for node, (message_id, deadline, looked_past) in sorted(self._joining.items()):
            if message_id not in pending or (deadline <= now and looked_past):
                ready.append(node)
            elif deadline <= now:
                self._joining[node] = (message_id, deadline, True)
        found.unanswered = [node for node in ready if self._joining[node][0] in pending]
        for node in ready:
            self._answers.forget(self._joining[node][0])  # a pull still stuck on it drops what it gets
            del self._joining[node]
        return ready, found
