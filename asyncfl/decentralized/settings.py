"""Settings of decentralized runs (the gossip relay and its peers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from asyncfl.errors import ConfigError
from asyncfl.strategies.registry import STRATEGY_CLASSES, declared_strategies
from asyncfl.strategies.settings import Knobs, knob

#: ``{run-config name: "module:Class"}`` of the gossip methods, each named in its own class body
#: (:class:`~asyncfl.decentralized.method.GossipMethod`), found as the server-side methods are.
GOSSIP_CLASSES: dict[str, str] = declared_strategies(Path(__file__).parent, __package__)
if set(GOSSIP_CLASSES) & set(STRATEGY_CLASSES):  # one run-config ``strategy`` names one method
    raise RuntimeError(f"strategy names claimed by a server-side and a gossip method: "
                       f"{sorted(set(GOSSIP_CLASSES) & set(STRATEGY_CLASSES))}")
GOSSIP_METHODS = tuple(GOSSIP_CLASSES)
TOPOLOGIES = ("random", "fixed")
#: How the centroid regulariser reduces a layer's squared distance (asyncfl/decentralized/regularizer.py).
PENALTIES = ("layer-mean", "sum")


@dataclass(frozen=True)
class GossipConfig(Knobs):
    """The relay's and the peers' knobs, each declared once here (run-config ``gossip.*``, and the methods' own
    ``pushcen.*``, ``swift.*``, ``divshare.*``); which method runs is run-config ``strategy``, its horizon
    ``max-time``. Defaults: the PushCen paper's where it gives one.

    Parameters
    ----------
    out_degree : int
        Online peers each push goes to (the paper's 10).
    buffer_capacity : int
        Messages a peer's buffer holds between its compute events.
    dedup : bool
        The buffer keeps the newest message per sender (false: every message, the paper's "No Buffer" ablation).
    delayed_fraction : float
        Share of the peers that join late, each at a random time in the first half of ``max-time`` (the paper's 10 %).
    eval_points : int
        Evaluations of every online peer over the horizon (the paper's 60).
    link_delay : float
        Virtual time a push takes to reach its receivers.
    local_test_fraction : float
        A peer's local test split as a share of the examples it keeps (with ``local_test_size`` 0).
    local_test_size : int
        0: the test split is ``local_test_fraction``; N > 0: N of the peer's own partition's examples (at most half
        of it), held out before ``max-samples-per-client`` draws its training examples, so that one image is not
        several points of a small peer's accuracy (the paper splits each client's data into local train and test
        sets).
    topology : str
        ``random`` draws the out-neighbours afresh at every push; ``fixed`` once per peer, seeded (a static directed
        graph, SWIFT's setting), a push going to those of them online.
    k : int
        PushCen's centroids per weight layer, one fixed at 0 (the paper's 32).
    lam : float
        PushCen's centroid-regulariser weight lambda (the paper's 0.1).
    penalty : str
        The centroid regulariser per layer: its mean (``layer-mean``, the reference code) or its sum (``sum``, Eq. 2 as
        written: on LeNet-5's 48,000-weight dense layer 48,000 times stronger at the same lambda).
    cache_size : int
        SWIFT: senders a peer keeps the newest model of (the least recently heard dropped).
    divshare_copies : int
        DivShare's J (Biswas et al., 2025), at most ``out_degree``: the out-neighbours each fragment goes to; a
        model is cut into ``out_degree // J`` fragments, so one push costs J models (1: one model over all
        out-neighbours; the PushCen paper's DivShare push, 2.06 of 10.27 MB to 10 neighbours, is J = 2).
    """

    label: ClassVar[str] = "gossip setting"
    prefix: ClassVar[str] = "gossip"

    out_degree: int = knob(10, minimum=1)
    buffer_capacity: int = knob(10, minimum=1)
    dedup: bool = knob(True)
    delayed_fraction: float = knob(0.1, minimum=0.0, below=1.0)
    eval_points: int = knob(60, minimum=1)
    link_delay: float = knob(0.0, minimum=0.0)
    local_test_fraction: float = knob(0.2, above=0.0, below=1.0)
    local_test_size: int = knob(0, minimum=0)
    topology: str = knob("random", choices=TOPOLOGIES)
    k: int = knob(32, minimum=2, maximum=256, key="pushcen.k")
    lam: float = knob(0.1, minimum=0.0, key="pushcen.lambda")
    penalty: str = knob("layer-mean", choices=PENALTIES, key="pushcen.penalty")
    cache_size: int = knob(10, minimum=1, key="swift.cache-size")
    divshare_copies: int = knob(1, minimum=1, key="divshare.copies")

    def check(self) -> None:
        if self.local_test_size and self.local_test_fraction != GossipConfig.local_test_fraction:
            raise ConfigError(f"gossip.local-test-size={self.local_test_size} sets each peer's test split, so "
                              f"gossip.local-test-fraction={self.local_test_fraction} would be ignored: set one of "
                              "them (local-test-size = 0 to use the fraction)")
        if self.divshare_copies > self.out_degree:
            self.fail("divshare_copies", f"must be in [1, gossip.out-degree = {self.out_degree}]")
