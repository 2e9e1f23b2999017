"""ThreadedPuller: how often each in-flight message is pulled (fake clock, counting grid)."""

import threading
import time

from asyncfl.server_app.puller import ThreadedPuller


class CountingGrid:
    """Never has a reply; counts the pulls of each message id."""

    def __init__(self) -> None:
        self.pulls: dict[str, int] = {}
        self._lock = threading.Lock()

    def pull_messages(self, message_ids):
        with self._lock:
            for message_id in message_ids:
                self.pulls[message_id] = self.pulls.get(message_id, 0) + 1
        return []


def _settle(puller: ThreadedPuller, expected: int) -> None:
    deadline = time.monotonic() + 5.0
    while puller.pulls < expected and time.monotonic() < deadline:
        time.sleep(0.005)


def test_the_wait_between_pulls_grows_with_the_message_age_within_bounds():
    puller = ThreadedPuller(CountingGrid(), workers=1, min_interval=0.2, max_interval=1.0, age_fraction=0.125)
    assert puller.interval(0.0) == 0.2  # young: the floor
    assert puller.interval(4.0) == 0.5  # an eighth of its age
    assert puller.interval(60.0) == 1.0  # old: the cap


def test_the_cap_defaults_to_the_class_value_which_an_ablation_may_set(monkeypatch):
    assert ThreadedPuller(CountingGrid(), workers=1).interval(60.0) == ThreadedPuller.MAX_INTERVAL == 1.0
    monkeypatch.setattr(ThreadedPuller, "MAX_INTERVAL", 2.5)
    puller = ThreadedPuller(CountingGrid(), workers=1)
    assert (puller.interval(8.0), puller.interval(16.0), puller.interval(60.0)) == (1.0, 2.0, 2.5)
    assert ThreadedPuller(CountingGrid(), workers=1, max_interval=0.5).interval(60.0) == 0.5  # an explicit cap wins


def test_a_message_is_pulled_again_only_after_its_interval():
    now = [0.0]
    grid = CountingGrid()
    puller = ThreadedPuller(grid, workers=1, clock=lambda: now[0])
    puller.poll(["m"])  # first sight: pulled at once
    _settle(puller, 1)
    for t in (0.1, 0.19):  # within the 0.2 s floor: not again
        now[0] = t
        puller.poll(["m"])
    now[0] = 0.25
    puller.poll(["m"])
    _settle(puller, 2)
    assert grid.pulls == {"m": 2}
    # At age 8 s the wait is 1 s: a poll 0.9 s after the last pull does not pull, one 1.05 s after does.
    now[0] = 8.0
    puller.poll(["m"])
    _settle(puller, 3)
    now[0] = 8.9
    puller.poll(["m"])
    now[0] = 9.05
    puller.poll(["m"])
    _settle(puller, 4)
    assert grid.pulls == {"m": 4}


def test_forgotten_messages_start_young_again():
    now = [0.0]
    grid = CountingGrid()
    puller = ThreadedPuller(grid, workers=1, clock=lambda: now[0])
    puller.poll(["m"])
    _settle(puller, 1)
    now[0] = 50.0
    puller.forget("m")
    puller.poll(["m"])  # a fresh message under a reused id: pulled at once, then at the floor again
    _settle(puller, 2)
    now[0] = 50.25
    puller.poll(["m"])
    _settle(puller, 3)
    assert grid.pulls == {"m": 3}


def test_a_message_whose_reply_was_pulled_is_not_pulled_again():
    """The SuperLink deletes a job once its reply is pulled; pulling the id again only brings Flower's
    MESSAGE_UNAVAILABLE error (and costs a request)."""
    import threading as _threading

    class Grid:
        def __init__(self):
            self.pulls, self.done = [], _threading.Event()

        def pull_messages(self, ids):
            self.pulls.extend(ids)
            self.done.set()
            return [object()]

    grid, now = Grid(), [0.0]
    puller = ThreadedPuller(grid, workers=1, clock=lambda: now[0])
    puller.poll(["m"])
    assert grid.done.wait(10)
    deadline = time.monotonic() + 10
    got = []
    while not got and time.monotonic() < deadline:
        got = puller.poll(["m"])
    now[0] += 100.0  # long past any interval: an id not yet delivered would be pulled again
    puller.poll(["m"])
    assert puller._requests.empty() and "m" not in puller._pending  # no second pull asked for
    assert grid.pulls == ["m"] and len(got) == 1
