"""How many ClientApps Flower's simulation runtime trains at once: ``cap-in-flight`` for a stock ClientApp.

In Flower's simulation runtime (``flwr run`` on a simulation SuperLink) the ServerApp is
handed an ``InMemoryGrid`` and runs in the process that drives Ray, and every node's jobs
queue for one pool of Ray actors of Flower's class ``ClientAppActor``: Ray's CPUs divided by
``client-resources num-cpus`` of them (one on two cores at Flower's default of 2 CPUs per
ClientApp). A job beyond that pool waits in Flower's queue while the model it carries ages.
Replies that report ``train-seconds`` let the wall clock measure that parallelism; a stock
ClientApp reports nothing, so where the engine runs inside Flower's simulation the actors
are counted instead, on Ray's own actor table (what ``ray list actors`` reads), which also
sees a multi-machine Ray cluster's actors.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

#: the Ray actor class that runs ClientApps in Flower's simulation runtime (flwr.simulation.ray_transport)
FLOWER_ACTOR_CLASS = "ClientAppActor"
#: seconds a count is reused: actors come and go only when Ray loses or restarts one
REFRESH_SECONDS = 10.0


def count_alive_actors(actors: dict) -> int:
    """ClientApp actors alive in Ray's actor table (``{actor id: {"ActorClassName", "State", ...}}``; this Ray
    job's only, :func:`read_ray_actors`)."""
    return sum(1 for actor in actors.values()
               if isinstance(actor, dict) and actor.get("ActorClassName") == FLOWER_ACTOR_CLASS
               and actor.get("State") == "ALIVE")


class FlowerSimulationWorkers:
    """Callable: the ClientApp actors Flower's simulation runtime has now, ``None`` when unknown.

    Refreshed at most every :data:`REFRESH_SECONDS` once actors are seen (at every call before); any
    failure to read Ray's table (Ray shut down, an internal API that moved) reads as unknown, and the
    wall clock then caps nothing.
    """

    def __init__(self, read_actors: Callable[[], dict], refresh: float = REFRESH_SECONDS) -> None:
        self.read_actors = read_actors
        self.refresh = refresh
        self._count: int | None = None
        self._read_at = -float("inf")

    def __call__(self) -> int | None:
        now = time.monotonic()
        if self._count is None or now - self._read_at >= self.refresh:
            self._read_at = now
            try:
                self._count = count_alive_actors(self.read_actors()) or None
            except Exception:  # noqa: BLE001 - Ray's table is internal: unknown rather than a failed run
                self._count = None
        return self._count


def read_ray_actors() -> dict:
    """Ray's actor table, ``{}`` before Ray is started in this process (Flower starts it beside the ServerApp,
    so the first jobs may be sent before it)."""
    import ray

    if not ray.is_initialized():
        return {}
    from ray._private import state

    job_id = ray.get_runtime_context().get_job_id()  # this simulation's actors, not another's on a shared cluster
    return {key: actor for key, actor in state.actors().items()
            if not isinstance(actor, dict) or actor.get("JobID") in (None, job_id)}


def flower_simulation_workers(grid) -> FlowerSimulationWorkers | None:
    """The actor count for ``grid`` when it is Flower's simulation runtime (Ray in this process), else ``None``
    (a deployment's SuperNodes each train on their own; asyncfl's in-process grids have no Ray)."""
    # looked up, not imported: outside a simulation the module (and the 600 it imports, seconds) is not loaded
    module = sys.modules.get("flwr.superlink.grid.inmemory_grid")
    in_memory_grid = getattr(module, "InMemoryGrid", None)
    if in_memory_grid is None or not isinstance(grid, in_memory_grid):
        return None
    return FlowerSimulationWorkers(read_ray_actors)
