"""Gradient-inversion compensation of stale updates (``gradient-inversion-stale-updates``)."""

from asyncfl.strategies.gi.inversion import InversionConfig, RecoveredSet, invert_update, replay_update
from asyncfl.strategies.gi.strategy import GICompensation
from asyncfl.strategies.gi.unrolled import LocalProgram

__all__ = ["GICompensation", "InversionConfig", "LocalProgram", "RecoveredSet", "invert_update", "replay_update"]
