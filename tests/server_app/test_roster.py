"""An identity answer whose objects never arrive holds a puller thread, never the run.

A SuperNode can upload its answer's message and never its objects: Flower 1.42's Grid then retries inside that
pull until the SuperLink's object-push session expires (180 s). The grid below does the same for node
:data:`STUCK`'s answers: a pull that asks for one waits until the test lets it go.
"""

from __future__ import annotations

import threading
import time

from flwr.app import ConfigRecord, Message, RecordDict

from asyncfl.server_app.discovery import Identities, query_identities, take_answers
from asyncfl.server_app.puller import ThreadedPuller
from asyncfl.server_app.roster import Roster
from tests.fake_grid import FakeGrid
from tests.server_app.test_engine import Recording, make_engine, plus_one

STUCK = 104


class StuckAnswerGrid(FakeGrid):
    """Node :data:`STUCK`'s identity answers are never fully uploaded: a pull that asks for one hangs until
    :attr:`let_go` is set (or 60 s pass, so that a test of code that waits on it fails instead of hanging)."""

    def __init__(self, nodes: int, online: int | None = None) -> None:
        super().__init__(nodes, plus_one)
        self.online = self.nodes[:online] if online is not None else list(self.nodes)
        self.stuck_ids: set[str] = set()
        self.stuck = threading.Event()  # a pull is held by a stuck answer
        self.let_go = threading.Event()
        self.returned = threading.Event()  # a held pull returned

    def get_node_ids(self):
        return list(self.online)

    def _identify(self, node: int, message: Message) -> Message:
        if node == STUCK:
            self.stuck_ids.add(message.metadata.message_id)
        return super()._identify(node, message)

    def pull_messages(self, message_ids):
        message_ids = list(message_ids)
        if self.stuck_ids & set(message_ids):
            self.stuck.set()
            self.let_go.wait(60.0)
            self.returned.set()
        return super().pull_messages(message_ids)


def test_the_start_query_of_a_deployment_ends_at_its_deadline_while_an_answer_is_stuck():
    """The others are identified; the stuck node is unanswered and its pull is still held when the query ends."""
    grid = StuckAnswerGrid(5)
    found = query_identities(grid, grid.nodes, 3.0, probe_first=False, puller=ThreadedPuller(grid, workers=2))
    assert grid.stuck.is_set() and not grid.returned.is_set()
    assert found.unanswered == [STUCK] and sorted(found.partition_of) == [101, 102, 103, 105]
    grid.let_go.set()


def test_a_joiner_whose_answer_is_stuck_does_not_hold_the_run():
    """Node 104 joins mid-run and its answer's pull hangs: no reply comes back until 104 is taken in (unidentified,
    after its wait), and the run then ends while that pull still hangs (its answer used to be pulled on the engine's
    thread: the run stopped with it)."""
    grid = StuckAnswerGrid(4, online=3)

    def join_then_hold(waiting):
        if len(grid.pushed) > 6 and STUCK not in grid.online:
            grid.online.append(STUCK)
        return waiting if STUCK not in grid.online or STUCK in engine.roster.nodes else []

    grid.release = join_then_hold
    engine = make_engine(grid, Recording(), clock="wall", concurrency=2, max_arrivals=20, identify_nodes=True)
    engine.roster.refresh_every, engine.roster.join_wait_s = 0.0, 0.2
    engine.run()
    assert grid.stuck.is_set() and not grid.returned.is_set()
    assert len(engine.strategy.seen) == 20 and STUCK in engine.clients and engine.stats.unidentified_nodes == 1
    grid.let_go.set()


class _NoDelays:
    def bind_clients(self, sizes, labels=None):
        pass


def test_a_joiners_answer_sent_before_its_wait_ends_is_taken_even_when_pulled_after_it():
    """Answers are pulled by threads between looks: the look past a joiner's wait asks for its answer once more,
    and the next look takes it (it used to be taken in unidentified at the first look past the wait)."""
    class LateAnswer(FakeGrid):
        answered, missed = threading.Event(), threading.Event()  # sent; a pull found nothing yet

        def __init__(self):
            super().__init__(4, plus_one)
            self.nodes, self.joiner_query = self.nodes[:3], None

        def _identify(self, node, message):
            if node == STUCK:
                self.joiner_query = message.metadata.message_id
            return super()._identify(node, message)

        def pull_messages(self, message_ids):
            if self.joiner_query in message_ids and not self.answered.is_set():
                self.missed.set()
                return []  # not sent yet
            return super().pull_messages(message_ids)

    grid = LateAnswer()
    roster = Roster(grid, _NoDelays(), identify=True, probe_first=False)
    roster.start([101, 102, 103], 5.0)
    roster.refresh_every, roster.join_wait_s = 0.0, 0.3
    grid.nodes.append(STUCK)
    roster.refresh()  # asked
    assert grid.joiner_query is not None and STUCK not in roster.nodes
    roster.refresh()  # its answer is asked for: the pull finds nothing
    assert grid.missed.wait(30) and STUCK not in roster.nodes
    grid.answered.set()  # sent within its wait, not pulled yet
    time.sleep(0.35)  # the wait passes
    roster.refresh()  # the look past the wait asks for the answer once more
    assert STUCK not in roster.nodes
    limit = time.monotonic() + 30
    while not roster._answers._replies.qsize() and time.monotonic() < limit:  # that pull handed the answer on
        time.sleep(0.005)
    roster.refresh()
    assert roster.owners[roster.index_of[STUCK]] == "partition-id:3" and roster.unidentified == 0


def test_an_answer_to_a_query_no_longer_awaited_is_ignored():
    """A thread may hand over an answer after its query was given up (or one that names another query): it is not
    taken as an identity."""
    request = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=101, message_type="query")
    request.metadata.__dict__["_message_id"] = "given-up"
    answer = Message(RecordDict({"config": ConfigRecord({"partition-id": 7, "num-examples": 5})}), reply_to=request)
    answer.metadata.__dict__["_src_node_id"] = 101
    found, pending = Identities(), {"awaited"}
    assert take_answers([answer], found, pending) == [] and pending == {"awaited"}
    assert not found.partition_of and not found.size_of


def test_a_deployments_roster_pulls_its_start_answers_in_threads_and_a_simulations_in_batches(monkeypatch):
    """Flower's deployment Grid (SuperNodes others may run) is told apart from simulations; on it the start query
    ends at its deadline while an answer's pull hangs."""
    from types import SimpleNamespace

    from flwr.superlink.grid.http_grid import HttpGrid

    from asyncfl.server_app import roster as roster_module
    from asyncfl.server_app.transport import on_superlink

    deployed = HttpGrid.__new__(HttpGrid)
    assert on_superlink(deployed) and on_superlink(SimpleNamespace(inner=deployed))
    assert not on_superlink(FakeGrid(2, plus_one))
    grid = StuckAnswerGrid(5)
    monkeypatch.setattr(roster_module, "on_superlink", lambda g: g is grid)
    roster = Roster(grid, _NoDelays(), identify=True, probe_first=False)
    roster.start(list(grid.nodes), 3.0)
    assert grid.stuck.is_set() and not grid.returned.is_set()
    assert roster.unidentified == 1 and roster.nodes[-1] == STUCK
    grid.let_go.set()
