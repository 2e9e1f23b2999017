"""Version store: global models kept only while some in-flight job needs them."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from asyncfl.server_app.codec import ModelCodec


class VersionStore:
    """Reference-counted global model versions.

    The current version is always kept; an older one lives only while a job
    dispatched with it is in flight, so memory grows with the concurrency, never
    with the number of clients or of versions.
    """

    def __init__(self, codec: ModelCodec, initial: np.ndarray) -> None:
        self.codec = codec
        self.version = 0
        self._models: dict[int, np.ndarray] = {0: initial}
        #: The current global model (flat).
        self.current: np.ndarray = initial
        self._records: dict[int, ArrayRecord] = {}
        self._refs: dict[int, int] = {}
        self.peak_versions = 1

    def record(self, version: int) -> ArrayRecord:
        """The ArrayRecord of ``version``, encoded once and shared by all its dispatches."""
        if version not in self._records:
            self._records[version] = self.codec.to_record(self._models[version])
        return self._records[version]

    def acquire(self) -> int:
        """Pin the current version for a new job; returns the version number."""
        self._refs[self.version] = self._refs.get(self.version, 0) + 1
        return self.version

    def model(self, version: int) -> np.ndarray:
        """The flat model of a pinned (or current) version."""
        return self._models[version]

    def release(self, version: int) -> None:
        """Unpin ``version`` for a finished job; drop it if nobody needs it anymore."""
        self._refs[version] -= 1
        if self._refs[version] == 0:
            del self._refs[version]
            if version != self.version:
                self._drop(version)

    def advance(self, new_model: np.ndarray) -> int:
        """Make ``new_model`` the current version; returns the new version number."""
        old = self.version
        self.version += 1
        self._models[self.version] = self.current = new_model
        if old not in self._refs:
            self._drop(old)
        self.peak_versions = max(self.peak_versions, len(self._models))
        return self.version

    def _drop(self, version: int) -> None:
        """Forget a version that is neither current nor pinned."""
        self._models.pop(version, None)
        self._records.pop(version, None)

    def state_dict(self) -> dict:
        """The current version number, every stored model and the pins on them (a checkpoint's part)."""
        return {"version": self.version, "models": dict(self._models), "refs": dict(self._refs),
                "peak_versions": self.peak_versions}

    def load_state_dict(self, state: dict) -> None:
        """Take the versions a checkpoint stored; their records are re-encoded on first use."""
        self.version = int(state["version"])
        self._models = {int(v): m for v, m in state["models"].items()}
        self.current = self._models[self.version]
        self._refs = {int(v): int(n) for v, n in state["refs"].items()}
        self._records = {}
        self.peak_versions = int(state["peak_versions"])

    @property
    def stored(self) -> int:
        """How many versions are held now."""
        return len(self._models)
