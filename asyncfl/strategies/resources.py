"""What the built-in app hands a strategy besides its knobs: its model builder and its data.

A library user passes these straight to a constructor (``FedEcho(model_fn=Net,
distill_inputs=...)``); the built-in app builds them from its model zoo and dataset
choices, and each class's :meth:`~asyncfl.strategies.base.Strategy.from_config` picks
what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class StrategyResources:
    """The built-in app's model and data, for the methods that run a network on the server.

    Parameters
    ----------
    make_model : callable
        Builds a fresh network of the run's architecture.
    x_train, y_train : np.ndarray
        The training split (FedADT's server set and DD-FedRevive's pool are drawn from it).
    seed : int
        The run's seed.
    data_dir, server_holdout : str, float
        Locate FedEcho's unlabeled set (a cross-dataset set on disk, or the server's hold-out rows).
    num_classes : int
        Label count.
    label_histogram : callable, optional
        ``(partition id, partitions) -> label counts`` (simulation only: FedRevive's true-proportion
        ablation and DD-FedRevive).
    train_config : dict, optional
        The clients' local-training keys (gradient-inversion compensation replays them).
    """

    make_model: Callable[[], Any]
    x_train: np.ndarray
    y_train: np.ndarray
    seed: int
    data_dir: str = ""
    server_holdout: float = 0.0
    num_classes: int = 10
    label_histogram: Callable[[int, int], np.ndarray] | None = None
    train_config: dict | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One example's shape."""
        return tuple(self.x_train.shape[1:])
