"""Fault and attack drills: a node that misbehaves on purpose, to see what the server does with it.

Deployments name a node's fault in its node-config (``fault=<kind>``, set when the SuperNode
starts); simulations, where every node shares one config, name an attack and how many nodes
make it in the run-config (``drill-attack``, ``drill-attackers``: partitions ``0 .. n-1``).

Broken replies (the server rejects them by reason): ``nan`` poisons the first tensor,
``wrong-shape`` drops its last element, ``error`` raises (Flower turns it into an error reply).

Poisoned updates (finite, well formed: what an update bound or a robust rule must handle), with
``Delta = trained - received`` over the floating-point entries:

* ``noise``: ``trained + N(0, 10^2)`` per entry (a faulty node returning garbage);
* ``sign-flip``: ``received - Delta`` (the sign-flipping attack);
* ``scale``: ``received + 10 * Delta`` (a boosted update, as in model replacement:
  Bagdasaryan et al., 2020, "How to backdoor federated learning");
* ``flip-scale``: ``received - 10 * Delta`` (a boosted sign flip: against learning, at ten times an
  honest norm; the attack an update bound must hold against when the attacker is fast);
* ``replace``: ``received - 3 * received`` (an update of ``-3 x``: under FedAsync's mixing weight 1
  it replaces the model by ``-2 x``; sent first, before any honest norm is known);
* ``forged-count``: ``sign-flip``'s arrays with ``num-examples`` reported as 10^9 (an example-weighted
  rule such as FedAvg gives it the whole step).

The noise is drawn from the job's seed, so a drill under a seed repeats exactly.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
from flwr.app import ArrayRecord

from asyncfl.errors import ConfigError

BROKEN = ("nan", "wrong-shape", "error")
ATTACKS = ("noise", "sign-flip", "scale", "flip-scale", "replace", "forged-count")
#: The example count the ``forged-count`` drill reports.
FORGED_COUNT = 10**9
FAULTS = BROKEN + ATTACKS
NOISE_SD = 10.0
SCALE = 10.0


def check_drill(run_config: Mapping[str, Any]) -> tuple[str, int]:
    """The run-config's ``(drill-attack, drill-attackers)``, checked; ``("", 0)`` = no drill."""
    attack = str(run_config.get("drill-attack", ""))
    attackers = run_config.get("drill-attackers", 0)
    if attack and attack not in FAULTS:
        raise ConfigError(f"drill-attack={attack!r} is not valid; choose one of: {', '.join(FAULTS)} (or \"\": none)")
    if isinstance(attackers, bool) or not isinstance(attackers, int) or attackers < 0:
        raise ConfigError(f"drill-attackers={attackers!r} must be an integer >= 0 (partitions 0 .. n-1 attack)")
    if bool(attack) != bool(attackers):
        raise ConfigError(f"drill-attack={attack!r} with drill-attackers={attackers}: set both (an attack and how "
                         "many nodes make it) or neither")
    return attack, attackers


def fault_of(node_config: Mapping[str, Any], run_config: Mapping[str, Any], partition_id: int) -> str:
    """This node's fault: its node-config ``fault``, else the run's drill if its partition is an attacker's."""
    fault = str(node_config.get("fault", ""))
    if fault:
        return fault
    attack, attackers = check_drill(run_config)
    return attack if partition_id < attackers else ""


def apply_fault(fault: str, trained: ArrayRecord, received: ArrayRecord, seed: int) -> ArrayRecord:
    """``trained`` as a node with ``fault`` returns it (unchanged when ``fault`` is empty)."""
    if not fault:
        return trained
    import torch  # the ClientApp has it loaded; a server checking a drill's settings does not need it
    if fault not in FAULTS:
        raise ConfigError(f"fault={fault!r} is not valid; choose one of: {', '.join(FAULTS)}")
    if fault == "error":
        raise RuntimeError("fault injection: this node was started with fault=error")
    state = trained.to_torch_state_dict()
    if fault in BROKEN:
        first = next(iter(state))
        state[first] = state[first].clone().float().fill_(float("nan")) if fault == "nan" \
            else state[first].flatten()[:-1]
        return ArrayRecord(state)
    if fault == "forged-count":
        fault = "sign-flip"
    sent = received.to_torch_state_dict()
    if list(sent) != list(state):  # a server that sent a plain list of arrays: match by position
        sent = OrderedDict(zip(state, sent.values()))
    rng = np.random.default_rng([seed % 2**32, 7])
    out = OrderedDict()
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            out[name] = tensor
            continue
        if fault == "noise":
            noise = torch.from_numpy(rng.normal(0.0, NOISE_SD, tuple(tensor.shape)).astype(np.float32))
            out[name] = tensor + noise.to(tensor.dtype)
        elif fault == "replace":
            out[name] = -2 * sent[name].to(tensor.dtype)
        else:
            delta = tensor - sent[name].to(tensor.dtype)
            factor = {"sign-flip": -1.0, "scale": SCALE, "flip-scale": -SCALE}[fault]
            out[name] = sent[name].to(tensor.dtype) + factor * delta
    return ArrayRecord(out)


def reported_examples(fault: str, honest: int) -> int:
    """The example count a node with ``fault`` reports (its honest count, or the ``forged-count`` drill's)."""
    return FORGED_COUNT if fault == "forged-count" else honest
