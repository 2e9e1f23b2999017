"""cap-in-flight for a stock ClientApp: inside Flower's simulation runtime the ClientApp actors are counted."""

import pytest

from asyncfl.server_app import simulation_workers
from asyncfl.server_app.clock import WallClock
from asyncfl.server_app.simulation_workers import FlowerSimulationWorkers, count_alive_actors, flower_simulation_workers


def _actors(alive: int, dead: int = 0, other: int = 0) -> dict:
    table = {f"a{i}": {"ActorClassName": "ClientAppActor", "State": "ALIVE"} for i in range(alive)}
    table.update({f"d{i}": {"ActorClassName": "ClientAppActor", "State": "DEAD"} for i in range(dead)})
    table.update({f"o{i}": {"ActorClassName": "SomethingElse", "State": "ALIVE"} for i in range(other)})
    return table


def test_only_flowers_alive_clientapp_actors_count():
    assert count_alive_actors(_actors(3, dead=2, other=4)) == 3
    assert count_alive_actors({"x": "not a dict"}) == 0


def test_only_this_jobs_actors_count_on_a_shared_ray_cluster(monkeypatch):
    import ray
    from ray._private import state

    from asyncfl.server_app.simulation_workers import read_ray_actors

    table = _actors(2)
    table.update({f"x{i}": {"ActorClassName": "ClientAppActor", "State": "ALIVE", "JobID": "02000000"}
                  for i in range(5)})
    for actor in list(table.values())[:2]:
        actor["JobID"] = "01000000"
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(state, "actors", lambda: table)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"get_job_id": lambda self: "01000000"})())
    assert count_alive_actors(read_ray_actors()) == 2


def test_an_unreadable_table_or_no_actor_is_unknown_and_counts_are_reused_for_a_while():
    reads = []

    def read():
        reads.append(1)
        return _actors(2)

    workers = FlowerSimulationWorkers(read, refresh=3600)
    assert workers() == 2 and workers() == 2 and len(reads) == 1  # reused
    assert FlowerSimulationWorkers(lambda: _actors(0))() is None
    assert FlowerSimulationWorkers(lambda: 1 / 0)() is None


def test_no_count_outside_flowers_simulation_runtime():
    from asyncfl.simulation.inprocess import InProcessGrid

    assert flower_simulation_workers(object()) is None
    assert flower_simulation_workers(InProcessGrid.__new__(InProcessGrid)) is None


def test_flowers_inmemory_grid_is_counted_once_ray_runs_in_this_process(monkeypatch):
    import ray
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid
    from ray._private import state

    monkeypatch.setattr(state, "actors", lambda: _actors(1, other=1))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    workers = flower_simulation_workers(InMemoryGrid.__new__(InMemoryGrid))
    assert workers is not None and workers() is None  # Flower starts Ray beside the ServerApp: not yet
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    assert workers() == 1


@pytest.mark.parametrize("workers, concurrency, cap", [(1, 5, 2), (2, 12, 3), (5, 5, 5), (8, 5, 5), (None, 5, 5)])
def test_a_stock_clientapp_in_flowers_simulation_keeps_one_job_more_than_the_actors_in_flight(workers, concurrency,
                                                                                               cap):
    clock = WallClock(delays=None)
    clock.simulation_workers = lambda: workers
    assert clock.in_flight_cap(concurrency) == cap


def test_the_cap_follows_the_actor_count_as_it_changes():
    clock, count = WallClock(delays=None), {"n": None}
    clock.simulation_workers = lambda: count["n"]
    assert clock.in_flight_cap(12) == 12  # the actors are not up yet: nothing capped
    count["n"] = 2
    assert clock.in_flight_cap(12) == 3


def test_replies_that_report_their_process_are_measured_as_before_not_counted():
    from types import SimpleNamespace

    clock = WallClock(delays=None)
    clock.simulation_workers = lambda: 1
    for i in range(8):  # 1 s of compute each, waits of 0.2 s and 4 s, 6 in flight, trained by two processes
        clock.observe_train_seconds(SimpleNamespace(client=i, node_id=100 + i, start=0.0, finish=1.2 if i % 2 else 5.0), 1.0, 6,
                                    process=f"p{i % 2}")
    # measured, not counted: 6 x (1 + 0.2) / 3.1 = 2.3 running -> 3, one more queued
    assert clock.in_flight_cap(6) == 4
    assert simulation_workers.FLOWER_ACTOR_CLASS == "ClientAppActor"
