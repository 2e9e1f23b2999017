"""A strategy's state for checkpoints: what it saves, what it restores, and what a saved state must match.

One piece of :class:`asyncfl.strategies.base.Strategy`: a checkpoint holds the class name, the
knobs and the :attr:`StrategyState.state_attributes`; a resumed run refuses another class or
other knobs, saying what differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _same(a: Any, b: Any) -> bool:
    """Knob values equal (arrays and nested values compared by content)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return bool(a == b)


def check_saved_strategy(state: dict, class_name: str, config: Any) -> None:
    """Refuse a checkpoint's strategy ``state`` unless it is ``class_name``'s, saved with ``config``'s knobs.

    A knob the checkpoint does not record (added to the method later) counts as equal when ``config``
    has it at its default, which reproduces what the saved run did. The message names each knob by its
    keyword and, for the built-in app, its run-config key.

    Raises
    ------
    StateError
        Saying what differs.
    """
    from asyncfl.state import StateError, capture, restore

    if state.get("class") != class_name:
        raise StateError(f"the checkpoint's strategy is {state.get('class')}, this run's is {class_name}")
    ours = restore(None, capture(config.keywords()))
    theirs = restore(None, state["config"])
    defaults = type(config).defaults() if hasattr(type(config), "defaults") else {}
    differ = sorted(k for k in set(ours) | set(theirs) if not _same(ours.get(k), theirs.get(k))
                    and not (k not in theirs and k in defaults and _same(ours.get(k), defaults[k])))
    if differ:
        def key(k: str) -> str:
            try:
                return f" (run-config {type(config).key_of(k)})"
            except (AttributeError, StopIteration):
                return ""

        raise StateError(f"the checkpoint's {class_name} has other settings: " + ", ".join(
            f"{k}={theirs.get(k)!r} there, {ours.get(k)!r} here{key(k)}" for k in differ))


class StrategyState:
    """Saving and restoring a strategy's state (mixed into :class:`~asyncfl.strategies.base.Strategy`)."""

    #: The attributes that change as arrivals come in (buffers, caches, moments, networks, random
    #: generators): what :meth:`state_dict` saves; ``()`` for a method without any. A subclass with
    #: more state names it here, or overrides :meth:`state_dict` / :meth:`load_state_dict` (as a torch
    #: ``Module`` does). ``None`` (a strategy that has not said): it cannot be checkpointed.
    state_attributes: tuple[str, ...] | None = None

    @property
    def checkpointable(self) -> bool:
        """Whether this strategy says what its state is (:attr:`state_attributes`, or its own :meth:`state_dict`)."""
        return self.state_attributes is not None or type(self).state_dict is not StrategyState.state_dict

    def state_dict(self) -> dict:
        """Everything that makes this strategy's next updates what they will be, as a plain copy.

        A fresh strategy built with the same keywords, started with :meth:`on_start` and given
        this dict through :meth:`load_state_dict` makes the same updates from the same arrivals:
        what a checkpoint saves and a resumed run restores. Contents: the class, its knobs
        (a checkpoint refuses another class or other knobs) and :attr:`state_attributes`.
        """
        from asyncfl.state import StateError, capture

        if self.state_attributes is None:
            raise StateError(f"{type(self).__qualname__} does not say what its state is, so it cannot be "
                             "checkpointed: give it a state_attributes tuple (() when it keeps none), or "
                             "state_dict()/load_state_dict() methods")
        self._settle()
        return {"class": type(self).__qualname__, "config": capture(self.config.keywords(), "config"),
                "state": {name: capture(getattr(self, name), name) for name in self.state_attributes}}

    def load_state_dict(self, state: dict) -> None:
        """Take the state :meth:`state_dict` saved (after :meth:`on_start`, before the first arrival).

        Raises
        ------
        StateError
            When ``state`` is another class's, or was saved with other knobs (naming what differs).
        """
        from asyncfl.state import restore

        self.check_state(state)
        for name in self.state_attributes:
            setattr(self, name, restore(getattr(self, name, None), state["state"][name], name))

    def check_state(self, state: dict) -> None:
        """Raise :class:`~asyncfl.state.StateError` unless ``state`` is this class's, saved with the same knobs
        and holding every one of :attr:`state_attributes` (the message says what differs)."""
        from asyncfl.state import StateError

        ours_name = type(self).__qualname__
        check_saved_strategy(state, ours_name, self.config)
        missing = sorted(set(self.state_attributes or ()) - set(state["state"]))
        if missing:
            raise StateError(f"the checkpoint's {ours_name} state lacks {', '.join(missing)}")

    def _settle(self) -> None:
        """Finish any background work (a thread computing logits or teachers) so the state is complete."""
