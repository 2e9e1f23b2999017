"""Callbacks: your code at every new server version and every evaluation, without overriding ``start``.

An experiment tracker, TensorBoard or a best-model file hangs off these::

    class SaveBest(asyncfl.Callback):
        best = 0.0

        def on_evaluation(self, info, metrics):
            if metrics["accuracy"] > self.best:
                self.best = metrics["accuracy"]
                torch.save(info.arrays.to_torch_state_dict(), "best.pt")

    FedBuff().start(grid, arrays, num_rounds=40, evaluate_fn=..., callbacks=[SaveBest()])

They run in the ServerApp, between events: a slow callback delays the server (and, on the
wall clock, the next dispatch), never the order in which replies are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from flwr.app import ArrayRecord


@dataclass(frozen=True)
class VersionInfo:
    """Where the run is when a callback is called.

    Parameters
    ----------
    version : int
        The server version (one per aggregation: FedBuff one per ``buffer_size`` updates).
    round : int
        The round of client work the version was made in, from 1 as Flower's ``server_round`` (round ``r``:
        accepted updates ``(r - 1) * cohort + 1`` to ``r * cohort``; 0 for the initial model; see
        ``Strategy.start``).
    arrivals : int
        Accepted client updates so far.
    time : float
        The clock (virtual units or wall seconds).
    """

    version: int
    round: int
    arrivals: int
    time: float
    record: Callable[[], "ArrayRecord"]

    @property
    def arrays(self) -> "ArrayRecord":
        """The global model of :attr:`version`, in the layout of ``initial_arrays`` (encoded on first use); in
        :meth:`Callback.on_evaluation` the model scored, which with ``tail_average_rounds`` > 1 is the mean over
        the last rounds (:class:`asyncfl.server_app.scoring.TailAverage`)."""
        return self.record()


class Callback:
    """Subclass and override what you need; each method does nothing by default."""

    def on_version(self, info: VersionInfo) -> None:
        """A new server version was made."""

    def on_evaluation(self, info: VersionInfo, metrics: dict) -> None:
        """The model of ``info.version`` was scored: ``metrics`` holds ``accuracy``, ``loss``, ``time``,
        ``server_version``, ``arrivals``, ``round`` (and ``class_accuracy`` when the evaluator reports it).
        Once per version and round: the run's last row, at the stop, is not told again for the same model."""

    def on_train_metrics(self, server_round: int, metrics: dict) -> None:
        """Round ``server_round`` of client work closed (or the run stopped inside it: a partial round):
        ``metrics`` are its accepted replies' train metrics, aggregated as Flower's
        (``result.train_metrics_clientapp[server_round]``, e.g. ``train_loss``)."""

    def on_federated_evaluation(self, server_round: int, metrics: dict) -> None:
        """The ClientApps' evaluation of round ``server_round``'s model is in, aggregated as Flower's
        (``result.evaluate_metrics_clientapp[server_round]``); with ``fraction_evaluate > 0`` only."""
