"""Emulated device speed: a Flower mod that makes a node's training take as long as its device would.

One machine can stand for a fleet of devices that compute in parallel when each node *waits* out the time its
device would need beyond the host's, instead of computing more: waiting costs the host no CPU, so the nodes'
emulated device times overlap as real devices' would. The mod works with any ``ClientApp``::

    from asyncfl.client_app.device_speed import device_speed

    app = ClientApp(mods=[device_speed])

What a node waits, for each ``train`` message (also ``train.<action>``), in this order:

1. The request's ``emulate-seconds`` (asyncfl's wall-clock engine with ``emulate-delay-scale > 0`` draws a job's
   duration from its delay model and sends it): the job is padded to last that long.
2. Else the node's slowdown ``s`` (how many times longer than the reference device it takes):
   with ``device-seconds = d > 0`` the job is padded to last ``s * d`` seconds (a nominal duration: the emulated
   fleet's times are known before the run, whatever the host's load); with ``device-seconds = 0`` (the default)
   the mod waits ``(s - 1)`` times the handler's measured time (no calibration, but a busy host stretches
   the emulated times too).

The host's own time is never taken back: a job whose handler already ran longer than its target, or a node
with ``s < 1`` in the measured mode, waits nothing. A train handler that fails (an error reply, or an exception,
raised again after the wait) waits as one that succeeds: the device had computed until it failed.
``evaluate`` and ``query`` messages pass through at once: only training is emulated.

Where a node's slowdown comes from (the first found): node config ``device-slowdown`` (a number > 0, one
node's own device: ``flower-supernode --node-config "... device-slowdown=5"``); else a named profile,
``device-profile``, read from the node config, then the run config, then :class:`DeviceSpeed`'s ``profile``;
else 1. ``device-seed`` and ``device-seconds`` are read the same way (node config, run config, constructor).
A profile deals out slowdowns by ``partition-id`` (exact shares of ``num-partitions`` nodes, as Flower's
simulation sets them), or by the node id where the node config has no partition: see
:class:`DeviceProfile`. A profile or a value that is wrong raises a ``ConfigError`` (a ``ValueError``) of one line that names
what is valid (in a ``ClientApp``, an error reply to the first train message).

When the mod waits it adds the waited seconds to the reply's ``train-seconds`` metric if the reply has one
(asyncfl's ``report_train_seconds`` mod or ClientApp): the engine then counts the emulated device time as
training, whichever of the two mods is listed first. Any other reply is returned as ``call_next`` gave it.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.common import MessageType

from asyncfl import protocol
from asyncfl.errors import ConfigError

#: Node config: this node's slowdown (seconds its device takes per second of the reference device's).
SLOWDOWN_KEY = "device-slowdown"
#: Node or run config: a named profile that deals out slowdowns (:data:`VALID_PROFILES`).
PROFILE_KEY = "device-profile"
#: Node or run config: the seed a profile deals slowdowns with (an int >= 0).
SEED_KEY = "device-seed"
#: Node or run config: a reference device's seconds per job; 0 = scale the handler's measured time instead.
SECONDS_KEY = "device-seconds"

#: The spread (standard deviation of the log-slowdown) of a profile's lognormal nodes: their median is 1.
LOGNORMAL_SIGMA = 0.25

#: A profile's slow share, by name.
SHARES = {"all": 1.0, "half": 1 / 2, "third": 1 / 3, "quarter": 1 / 4, "fifth": 1 / 5, "tenth": 1 / 10}
_SLOWER = re.compile(r"(?P<share>[a-z]+)-(?P<k>[0-9]+(?:\.[0-9]+)?)x-slower")

#: What a profile may be called, as the error for a wrong one says.
VALID_PROFILES = ("'uniform', 'lognormal' or '<" + "|".join(SHARES) + ">-<K>x-slower' with K >= 1 "
                  "(e.g. 'quarter-5x-slower')")

_log = logging.getLogger(__name__)

def _rng(seed: int, *key: int) -> np.random.Generator:
    """A generator for one purpose and one node: independent of every other (purpose, node) pair."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


_PURPOSE_SHARE, _PURPOSE_COIN, _PURPOSE_SPREAD = 0, 1, 2
_BY_PARTITION, _BY_NODE_ID = 0, 1


@dataclass(frozen=True)
class DeviceProfile:
    """A named rule that gives each node of a fleet a slowdown, the same one on every run with the same seed.

    Parameters
    ----------
    name : str
        The name it was parsed from.
    slow_share : float
        The share of nodes that are slow (0 to 1).
    slow_factor : float
        The slow nodes' slowdown (>= 1).
    sigma : float
        The other nodes' slowdowns are ``exp(sigma * z)`` with ``z`` standard normal (median 1); 0 = exactly 1.

    Notes
    -----
    ``'uniform'``: every node 1. ``'lognormal'``: every node lognormal around 1. ``'<share>-<K>x-slower'``
    (share one of :data:`SHARES`): that share of the nodes ``K`` times slower, the rest lognormal around 1.
    With a known ``num-partitions`` the slow nodes are the first ``round(share * num-partitions)`` of a seeded
    permutation of the partition ids, so the share is exact; by node id (no partition in the node config) each
    node is slow with probability ``share``, so the share holds only on average.
    """

    name: str
    slow_share: float
    slow_factor: float
    sigma: float

    @classmethod
    def parse(cls, text: Any, sigma: float = LOGNORMAL_SIGMA) -> "DeviceProfile":
        """The profile ``text`` names.

        Parameters
        ----------
        text : str
            ``'uniform'``, ``'lognormal'`` or ``'<share>-<K>x-slower'``.
        sigma : float, optional
            The lognormal spread of the nodes that are not slow (``'uniform'`` has none).

        Raises
        ------
        ConfigError
            One line naming the valid profiles, for anything else.
        """
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma >= 0):
            raise ConfigError(f"device profile sigma = {sigma!r} must be a finite number >= 0")
        if text == "uniform":
            return cls("uniform", 0.0, 1.0, 0.0)
        if text == "lognormal":
            return cls("lognormal", 0.0, 1.0, float(sigma))
        match = _SLOWER.fullmatch(text) if isinstance(text, str) else None
        if match is None or match["share"] not in SHARES or float(match["k"]) < 1:
            raise ConfigError(f"{PROFILE_KEY} = {text!r} is not a profile; valid: {VALID_PROFILES}")
        return cls(text, SHARES[match["share"]], float(match["k"]), float(sigma))

    def slowdown(self, seed: int, partition_id: int | None = None, num_partitions: int | None = None,
                 node_id: int | None = None) -> float:
        """One node's slowdown: by ``partition_id`` of ``num_partitions`` when both are known, else by ``node_id``.

        Parameters
        ----------
        seed : int
            The seed (>= 0) the profile deals with; the same seed gives every node the same slowdown again.
        partition_id, num_partitions : int, optional
            The node's partition and the number of partitions (Flower's ``partition-id`` / ``num-partitions``).
        node_id : int, optional
            The node's id, used when the partition is not known.

        Returns
        -------
        float
            ``slow_factor`` for a slow node, else its lognormal draw (1 with ``sigma = 0``).
        """
        if partition_id is not None and num_partitions is not None and 0 <= partition_id < num_partitions:
            slow_count = math.floor(self.slow_share * num_partitions + 0.5)
            order = _rng(seed, _PURPOSE_SHARE, num_partitions).permutation(num_partitions)
            slow = self.slow_share > 0 and partition_id in order[:slow_count]
            key = (_BY_PARTITION, partition_id)
        elif node_id is not None and node_id >= 0:
            key = (_BY_NODE_ID, node_id)
            slow = self.slow_share > 0 and _rng(seed, _PURPOSE_COIN, *key).random() < self.slow_share
        else:
            raise ConfigError("a device profile needs the node's partition-id and num-partitions "
                             "(node config) or a node id >= 0")
        if slow:
            return self.slow_factor
        if self.sigma == 0:
            return 1.0
        return float(math.exp(self.sigma * _rng(seed, _PURPOSE_SPREAD, *key).standard_normal()))

    def fleet(self, num_partitions: int, seed: int = 0) -> list[float]:
        """The slowdowns of partitions ``0 .. num_partitions - 1``, in order (for an ideal rate, a plot, a table)."""
        return [self.slowdown(seed, p, num_partitions) for p in range(num_partitions)]


def _number(key: str, value: Any, minimum: float, strict: bool) -> float:
    """``value`` as a finite float above (``strict``) or at ``minimum``; a one-line ``ConfigError`` otherwise."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < minimum or (strict and number == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ConfigError(f"{key} = {value!r} must be a finite number {bound}")
    return number


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{SEED_KEY} = {value!r} must be an integer >= 0")
    try:
        seed = int(value)
    except ValueError:
        raise ConfigError(f"{SEED_KEY} = {value!r} must be an integer >= 0") from None
    if seed < 0 or seed != float(value):
        raise ConfigError(f"{SEED_KEY} = {value!r} must be an integer >= 0")
    return seed


@dataclass(frozen=True)
class Plan:
    """How long one train job should take: pad it to ``target`` seconds, or stretch it ``slowdown`` times.

    Parameters
    ----------
    target : float or None
        Seconds the job should last in all (``emulate-seconds``, or slowdown times ``device-seconds``).
    slowdown : float
        Used when ``target`` is None: the job should last ``slowdown`` times the handler's measured time.
    """

    target: float | None
    slowdown: float

    def wait(self, measured: float) -> float:
        """Seconds to wait after a handler that took ``measured`` seconds (never negative)."""
        total = self.target if self.target is not None else self.slowdown * measured
        return max(0.0, total - measured)


class DeviceSpeed:
    """A Flower mod (``mod(msg, context, call_next) -> Message``) that waits out a node's emulated device time.

    Parameters
    ----------
    profile : str, optional
        A profile name (:data:`VALID_PROFILES`) used when neither the node config nor the run config names
        one; ``None``: slowdown 1 unless the config says otherwise.
    seed : int, optional
        The profile's seed when the config has no ``device-seed``.
    seconds : float, optional
        A reference device's seconds per job when the config has no ``device-seconds``; 0 (default) scales
        the handler's measured time instead.
    sigma : float, optional
        The lognormal spread of a profile's nodes that are not slow.
    sleep, clock : callable, optional
        ``time.sleep`` and ``time.monotonic`` unless replaced (tests give fakes: no real waiting).

    Raises
    ------
    ConfigError
        At construction, for a wrong ``profile``, ``seed``, ``seconds`` or ``sigma``; at a train message, for a
        wrong value in the node or run config.
    """

    def __init__(self, profile: str | None = None, *, seed: int = 0, seconds: float = 0.0,
                 sigma: float = LOGNORMAL_SIGMA, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        DeviceProfile.parse("lognormal", sigma)  # checks sigma
        self.profile = None if profile is None else DeviceProfile.parse(profile, sigma)
        self.seed = _seed(seed)
        self.seconds = _number(SECONDS_KEY, seconds, 0.0, strict=False)
        self.sigma = float(sigma)
        self.sleep = sleep
        self.clock = clock
        self._warned_overrun = False

    @staticmethod
    def _setting(context: Context, key: str) -> Any:
        """``key`` from the node config, else the run config, else None."""
        for config in (context.node_config, context.run_config):
            if key in config:
                return config[key]
        return None

    def slowdown(self, context: Context) -> float:
        """This node's slowdown: node config ``device-slowdown``, else its profile's draw, else 1."""
        own = context.node_config.get(SLOWDOWN_KEY)
        if own is not None:
            return _number(SLOWDOWN_KEY, own, 0.0, strict=True)
        named = self._setting(context, PROFILE_KEY)
        profile = DeviceProfile.parse(named, self.sigma) if named is not None else self.profile
        if profile is None:
            return 1.0
        seed = self._setting(context, SEED_KEY)
        partition, partitions = _partition(context.node_config)
        return profile.slowdown(self.seed if seed is None else _seed(seed), partition, partitions,
                                node_id=int(context.node_id))

    def plan(self, msg: Message, context: Context) -> Plan:
        """How long this train job should take (read before the handler runs, so a wrong setting fails first)."""
        request = msg.content.config_records.get("config", ConfigRecord())
        drawn = request.get(protocol.EMULATE_SECONDS)
        if drawn is not None and float(drawn) > 0:  # the server drew the job's duration itself
            return Plan(float(drawn), 1.0)
        slowdown = self.slowdown(context)
        seconds = self._setting(context, SECONDS_KEY)
        seconds = self.seconds if seconds is None else _number(SECONDS_KEY, seconds, 0.0, strict=False)
        return Plan(slowdown * seconds, slowdown) if seconds > 0 else Plan(None, slowdown)

    def __call__(self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        """Run ``call_next``; for a train message, then wait what the plan says and count it in ``train-seconds``."""
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, context)
        plan = self.plan(msg, context)
        if plan.target is None and plan.slowdown <= 1.0:
            return call_next(msg, context)  # nothing to add: not even a clock read
        started = self.clock()
        try:
            reply = call_next(msg, context)
        except Exception:
            self._wait(plan, self.clock() - started)  # the device had computed until it failed
            raise
        wait = self._wait(plan, self.clock() - started)
        if wait > 0 and not reply.has_error():
            _count_in_train_seconds(reply, wait)
        return reply

    def _wait(self, plan: Plan, measured: float) -> float:
        """Sleep what ``plan`` leaves after ``measured`` seconds of handler; return the seconds slept."""
        wait = plan.wait(measured)
        if plan.target is not None and wait == 0 and measured > plan.target and not self._warned_overrun:
            self._warned_overrun = True  # once per process: the host, not the emulated device, set this job's time
            _log.warning("device-speed: a train job took %.3g s on this host, longer than its emulated %.3g s; "
                         "such jobs last the host's time", measured, plan.target)
        if wait > 0:
            self.sleep(wait)
        return wait


def _partition(node_config: Mapping[str, Any]) -> tuple[int | None, int | None]:
    try:
        return int(node_config[protocol.PARTITION_ID]), int(node_config[protocol.NUM_PARTITIONS])
    except (KeyError, TypeError, ValueError):
        return None, None


def _count_in_train_seconds(reply: Message, wait: float) -> None:
    """Add ``wait`` to the reply's ``train-seconds`` metric, when it reports one."""
    metrics = protocol.reply_metrics(reply.content)
    seconds = protocol.train_seconds(metrics)
    if seconds is not None:
        metrics[protocol.TRAIN_SECONDS] = seconds + wait


_DEFAULT = DeviceSpeed()


def device_speed(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Flower mod: a node's train jobs take the time its emulated device would (``ClientApp(mods=[device_speed])``).

    Configured by the node and run config only (``device-slowdown``, ``device-profile``, ``device-seed``,
    ``device-seconds``) or by the request's ``emulate-seconds``; with none of them it adds nothing. For a profile
    or seed set in code, or a fake clock, use :class:`DeviceSpeed` (``mods=[DeviceSpeed("quarter-5x-slower")]``).
    """
    return _DEFAULT(msg, context, call_next)
