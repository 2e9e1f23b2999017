"""Settings of decentralized runs (the gossip relay and its peers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asyncfl.errors import ConfigError
from asyncfl.strategies.registry import STRATEGY_CLASSES, declared_strategies

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
class GossipConfig:
    """The relay's and the peers' knobs (``gossip.*`` and ``pushcen.*`` in run-config).

    PushCen paper defaults: 10 out-neighbours per push, k = 32 centroids, lambda = 0.1,
    10% delayed peers, 60 evaluation points over the horizon. ``topology``: 'random' draws
    the out-neighbours afresh at every push, 'fixed' once per peer (a static directed
    graph, SWIFT's setting). ``cache_size``: senders a SWIFT peer keeps models of. ``penalty``: the
    centroid regulariser per layer, its mean (the reference code) or its sum (Eq. 2 as written).
    ``divshare_copies``: DivShare's J (Biswas et al., 2025), the out-neighbours each fragment goes to; a
    model is cut into ``out_degree // J`` fragments, so one push costs J models (1: one model over all
    out-neighbours; the PushCen paper's DivShare push, 2.06 of 10.27 MB to 10 neighbours, is J = 2).
    ``local_test_size``: 0 = a peer's local test split is ``local_test_fraction`` of the examples it keeps;
    N > 0 = N of its own partition's examples, held out before ``max-samples-per-client`` draws its training
    examples, so that a peer with few training examples is still tested on enough of its own distribution that
    one image is not several points of its accuracy (the paper splits each client's data into local train and
    test sets; its CIFAR-10 peers hold ~500 examples).
    """

    method: str = "pushcen"
    out_degree: int = 10
    buffer_capacity: int = 10
    dedup: bool = True
    delayed_fraction: float = 0.1
    eval_points: int = 60
    horizon: float = 30.0
    link_delay: float = 0.0
    local_test_fraction: float = 0.2
    local_test_size: int = 0
    k: int = 32
    lam: float = 0.1
    topology: str = "random"
    cache_size: int = 10
    penalty: str = "layer-mean"
    divshare_copies: int = 1

    def __post_init__(self) -> None:
        if self.method not in GOSSIP_METHODS:
            raise ConfigError(f"unknown gossip method {self.method!r}; valid: {', '.join(GOSSIP_METHODS)}")
        if self.out_degree < 1 or self.buffer_capacity < 1 or self.eval_points < 1:
            raise ConfigError("gossip.out-degree, gossip.buffer-capacity and gossip.eval-points must be >= 1")
        if not 0.0 <= self.delayed_fraction < 1.0 or self.horizon <= 0 or self.link_delay < 0:
            raise ConfigError("need 0 <= gossip.delayed-fraction < 1, max-time > 0 and gossip.link-delay >= 0")
        if not 0.0 < self.local_test_fraction < 1.0:
            raise ConfigError(f"gossip.local-test-fraction must be in (0, 1), got {self.local_test_fraction}")
        if self.local_test_size < 0:
            raise ConfigError(f"gossip.local-test-size must be >= 0 (0: local-test-fraction), got {self.local_test_size}")
        if self.local_test_size and self.local_test_fraction != GossipConfig.local_test_fraction:
            raise ConfigError(f"gossip.local-test-size={self.local_test_size} sets each peer's test split, so "
                              f"gossip.local-test-fraction={self.local_test_fraction} would be ignored: set one of "
                              "them (local-test-size = 0 to use the fraction)")
        if self.topology not in TOPOLOGIES:
            raise ConfigError(f"unknown gossip.topology {self.topology!r}; valid: {', '.join(TOPOLOGIES)}")
        if self.cache_size < 1:
            raise ConfigError(f"swift.cache-size must be >= 1, got {self.cache_size}")
        if not 1 <= self.divshare_copies <= self.out_degree:
            raise ConfigError(f"divshare.copies must be in [1, gossip.out-degree = {self.out_degree}], "
                             f"got {self.divshare_copies}")
        if self.penalty not in PENALTIES:
            raise ConfigError(f"unknown pushcen.penalty {self.penalty!r}; valid: {', '.join(PENALTIES)}")
        if not 2 <= self.k <= 256 or self.lam < 0:
            raise ConfigError(f"need 2 <= pushcen.k <= 256 and pushcen.lambda >= 0, got k={self.k}, lambda={self.lam}")
