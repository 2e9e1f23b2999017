"""The engine to a checkpoint and back: :func:`snapshot` and :func:`resume_from`.

A snapshot is taken between two events, at the top of the loop: no reply is half accepted,
so a run resumed from it repeats what the first run does next. It holds the run's settings
and model layout (checked before a resume starts), the clients' sizes, the strategy's state,
the engine's :class:`~asyncfl.server_app.engine_state.EngineState` and the state of each part
around the engine that has one.

* Virtual clock: the jobs that were in flight are sent again as they were (client, model
  version, request with its job seed, virtual times); the run is byte-identical to an
  uninterrupted one.
* Wall clock: a reply cannot be had again, so the events accepted after the checkpoint are
  replayed from its journal (:mod:`~asyncfl.server_app.journal`); jobs still out when the run
  died count ``lost-in-restart``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from asyncfl.errors import CheckpointError
from asyncfl.server_app import journal
from asyncfl.server_app.checkpoint import layout_of, resume_settings
from asyncfl.server_app.engine_state import Job
from asyncfl.state import capture, restore

if TYPE_CHECKING:
    from asyncfl.server_app.engine import AsyncEngine

log = logging.getLogger("asyncfl.engine")

#: Parts whose state checkpoints written before them lack (they start fresh on resume).
PARTS_ADDED_LATER = ("update_bound", "count_ceiling")


def stateful_parts(engine: AsyncEngine) -> dict[str, object]:
    """The parts around the engine that carry state of their own (each has state_dict/load_state_dict or
    state_attributes); the recorder last, so that it cuts its files back only once all else fitted."""
    parts = {"delays": engine.delays, "scoring": engine.scoring, "train_metrics": engine.train_metrics,
             "federated_eval": engine.federated_eval, "evaluate_fn": engine.evaluate_fn,
             "update_bound": engine.bounds.norm, "count_ceiling": engine.bounds.count,
             "trusted_direction": engine.bounds.direction, "recorder": engine.recorder}
    return {name: part for name, part in parts.items()
            if part is not None and (hasattr(part, "state_dict") or hasattr(type(part), "state_attributes"))}


def snapshot(engine: AsyncEngine) -> dict:
    """The whole server state at this moment, as a plain tree (:mod:`asyncfl.state`)."""
    tree = {"settings": resume_settings(engine.config), "layout": layout_of(engine.codec),
            "clients": {"sizes": [int(s) for s in engine.roster.sizes]}, "strategy": engine.strategy.state_dict()}
    tree.update(engine.state.snapshot())
    tree["parts"] = {name: part.state_dict() if hasattr(part, "state_dict") else capture(part, name)
                     for name, part in stateful_parts(engine).items()}
    return tree


def resume_from(engine: AsyncEngine, tree: dict) -> None:
    """Continue ``engine`` from a :func:`snapshot` (after discovery and the strategy's ``on_start``)."""
    sizes = [int(s) for s in engine.roster.sizes]
    if tree["clients"]["sizes"] != sizes:
        raise CheckpointError(
            f"the checkpoint was made with {len(tree['clients']['sizes'])} client(s) of sizes "
            f"{tree['clients']['sizes'][:8]}..., this run has {len(sizes)} of sizes {sizes[:8]}... after waiting "
            f"up to {engine.config.wait_for_nodes:.0f}s for them (wait-for-nodes): resume with the same nodes and data "
            "(raise wait-for-nodes while nodes are still reconnecting)")
    engine.strategy.load_state_dict(tree["strategy"])
    jobs = engine.state.restore(tree)
    parts = stateful_parts(engine)
    missing = sorted(set(parts) - set(tree["parts"]) - set(PARTS_ADDED_LATER))
    if missing:
        raise CheckpointError(f"the checkpoint has no state for {', '.join(missing)}: it was made by a run "
                              "set up otherwise (federated evaluation, evaluate_fn, run folder)")
    for name, part in parts.items():
        if name not in tree["parts"]:  # a part added after the checkpoint was written starts fresh
            continue
        if hasattr(part, "load_state_dict"):
            part.load_state_dict(tree["parts"][name])
        else:
            restore(part, tree["parts"][name], name)
    engine.scoring.tail.check(engine.versions.current)
    # every round due was closed before the checkpoint
    engine.state.rounds_closed = engine.state.rounds(engine.config.round_arrivals)[0]
    if engine.checkpoints is not None:
        engine.checkpoints.last_version = engine.versions.version
    engine.clock.resume_at(engine.state.now)
    if tree.get("journal"):
        jobs = journal.replay(engine, tree["journal"], jobs)
    _reissue(engine, jobs)
    log.info("resumed at server version %d after %d accepted updates (clock %.3f): %d job(s) in flight re-sent",
             engine.versions.version, engine.stats.arrivals, engine.state.now, len(engine.state.in_flight))


def _reissue(engine: AsyncEngine, saved: list[dict]) -> None:
    """Send again the checkpoint's jobs in flight as they were sent (client, model, seed, clock times), so their
    replies are the ones the first run would have accepted; on the wall clock, where a reply depends on when it
    comes back, count them ``lost-in-restart`` and fill their slots anew."""
    if engine.clock.nodes_come_and_go:
        for job in saved:
            engine.versions.release(job["version"])
            engine.stats.reject("lost-in-restart")
        if saved:
            log.warning("%d job(s) in flight at the checkpoint were lost with the run that wrote it "
                        "(lost-in-restart); their slots are filled anew", len(saved))
        return
    nodes = engine.roster.nodes
    for entry in saved:
        if entry["client"] >= len(nodes):
            raise CheckpointError(f"the checkpoint has a job for client {entry['client']}; this run has "
                                  f"{len(nodes)} clients")
    engine.push([Job("", nodes[e["client"]], e["client"], e["version"], e["start"], e["finish"], e["seq"], 0.0,
                     sent_model=e["sent_model"], request=e["request"]) for e in saved])
    engine.slots.update_all()
