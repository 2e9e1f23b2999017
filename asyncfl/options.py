"""How the engine runs: scheduling, stopping and evaluation options, checked in one place.

Both the built-in app's run-config parser (:mod:`asyncfl.config`) and the library's
``Strategy.start`` build an :class:`EngineConfig`; the engine reads nothing else. This
module imports no run-config parser, data or models, so importing the engine loads
none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncfl.simulation.categories import RuntimeCategories
from asyncfl.simulation.delays import DelayModel
from asyncfl.simulation.intertwined import IntertwinedDelays
from asyncfl.strategies.settings import ConfigError

#: ``virtual``: simulation, replies accepted in the order of drawn durations; ``wall``: real arrival order.
CLOCKS = ("virtual", "wall")


@dataclass(frozen=True)
class EngineConfig:
    """How the engine schedules jobs, stops and evaluates."""

    clock: str
    concurrency: int
    max_arrivals: int
    max_virtual_time: float
    eval_every: float
    target_accuracy: tuple[float, ...]
    job_timeout: float
    wait_for_nodes: float
    seed: int
    delay_preset: str
    delays: DelayModel | RuntimeCategories | IntertwinedDelays
    eval_batch_size: int
    progress: bool
    emulate_delay_scale: float = 0.0
    overlap: bool = False
    server_time_scale: float = 0.0
    round_deadline: float = 0.0
    pipeline_late_clients: bool = False
    max_rounds: int = 0  # stop after this many rounds (0 = no cap); Flower's num_rounds
    eval_every_rounds: int = 0  # also evaluate every this many rounds (0 = by clock only)
    # a round is this many accepted updates (asynchronous strategies under Flower's num_rounds: the cohort
    # FedAvg would train); 0: a round is a server version (synchronous strategies, the built-in app)
    round_arrivals: int = 0
    identify_nodes: bool = True  # ask nodes for partition id and size (query messages) before the first job
    jobs_per_client: int = 1  # wall clock: jobs a client may have out at once (> 1 queues its next job)

    def __post_init__(self) -> None:
        """Settings that exclude or need each other (checked for the run-config and for ``start()`` alike)."""
        if self.pipeline_late_clients and self.round_deadline <= 0:
            raise ConfigError("pipeline-late-clients (pipeline_late_clients) lets clients whose job missed the round "
                              "deadline train again; it needs round-deadline > 0 (semi-asynchronous rounds)")
        if self.round_deadline > 0 and self.clock != "virtual":
            raise ConfigError("round-deadline (round_deadline: semi-asynchronous rounds) needs clock = 'virtual'; "
                              "set it to 0 for wall-clock runs")
        if isinstance(self.delays, IntertwinedDelays) and self.clock != "virtual":
            raise ConfigError("delay-model 'intertwined' is a simulation scenario; it needs clock = 'virtual'")
        if self.overlap and self.server_time_scale > 0:
            raise ConfigError("overlap-server-compute (overlap_server_compute) hides server time from clients; set "
                              "server-time-scale (server_time_scale) = 0 with it, or turn overlap off to charge server "
                              "time to the virtual clock")
        if isinstance(self.jobs_per_client, bool) or not isinstance(self.jobs_per_client, int) \
                or self.jobs_per_client < 1:
            raise ConfigError(f"jobs-per-client (jobs_per_client) = {self.jobs_per_client!r}: it must be an integer "
                              ">= 1 (1 = one job per client at a time)")
        if self.jobs_per_client > 1 and self.clock != "wall":
            raise ConfigError("jobs-per-client (jobs_per_client) > 1 queues a client's next job at the SuperLink while "
                              "it trains; that is a deployment setting and needs clock = 'wall' (the virtual clock "
                              "draws every job's duration from its dispatch)")
        if self.max_arrivals == 0 and self.max_virtual_time == 0 and self.max_rounds == 0:
            raise ConfigError("set max-arrivals > 0 or max-virtual-time > 0, or the run never stops")
        if self.eval_every <= 0 and self.eval_every_rounds <= 0:
            raise ConfigError("set eval-every > 0 (clock units) or evaluate every so many rounds")
        if isinstance(self.round_arrivals, bool) or not isinstance(self.round_arrivals, int) or self.round_arrivals < 0:
            raise ConfigError(f"round_arrivals={self.round_arrivals!r} must be an integer >= 0 "
                              "(0: a round is a server version)")
