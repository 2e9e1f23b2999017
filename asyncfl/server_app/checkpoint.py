"""Checkpoint files: the server's whole state at a version boundary, written atomically, the newest N kept (1).

A checkpoint is one ``.npz`` file (numpy's zip of ``.npy`` arrays, read back with
``allow_pickle=False``: loading one runs no code): ``tree`` holds the state as JSON
with each array replaced by its index, ``a0``, ``a1``, ... the arrays. It is written
to a temporary name, flushed to disk and renamed over, so a crash while writing
leaves the previous checkpoint intact; older ones beyond ``keep`` are removed after.

What the state holds is the engine's business (:meth:`AsyncEngine.snapshot`); this
module only stores and finds trees made by :func:`asyncfl.state.capture`.
"""

from __future__ import annotations

import json
import logging
import numbers
import os
import re
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from asyncfl.errors import CheckpointError

#: Bumped when the tree's meaning changes; a checkpoint of another format is refused.
FORMAT = 1
FOLDER = "checkpoints"
_NAME = re.compile(r"^checkpoint-v(\d+)-a(\d+)\.npz$")
_ARRAY = "__array__"

log = logging.getLogger("asyncfl.engine")


def encode(tree: Any) -> tuple[Any, list[np.ndarray]]:
    """JSON-ready ``tree`` with every array replaced by ``{"__array__": index}``, and the arrays."""
    arrays: list[np.ndarray] = []

    def walk(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise CheckpointError(f"cannot store an object array (shape {value.shape}) in a checkpoint")
            arrays.append(value)
            return {_ARRAY: len(arrays) - 1}
        if isinstance(value, dict):
            bad = [k for k in value if not isinstance(k, str)]
            if bad:
                raise CheckpointError(f"checkpoint trees have string keys only; got {bad[0]!r}")
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise CheckpointError(f"cannot store a {type(value).__name__} in a checkpoint (capture() it first)")

    return walk(tree), arrays


def decode(tree: Any, arrays: list[np.ndarray]) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(tree, dict):
        if set(tree) == {_ARRAY}:
            return arrays[tree[_ARRAY]]
        return {k: decode(v, arrays) for k, v in tree.items()}
    if isinstance(tree, list):
        return [decode(v, arrays) for v in tree]
    return tree


def write(path: Path, tree: Any) -> int:
    """Write ``tree`` to ``path`` atomically; returns the file's size in bytes."""
    document, arrays = encode({"format": FORMAT, **tree})
    payload = {f"a{i}": array for i, array in enumerate(arrays)}
    payload["tree"] = np.frombuffer(json.dumps(document, allow_nan=True).encode(), dtype=np.uint8)
    temporary = path.with_name(path.name + ".partial")
    with open(temporary, "wb") as handle:
        np.savez(handle, **payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return path.stat().st_size


def read(path: Path) -> dict:
    """The tree stored at ``path``.

    Raises
    ------
    CheckpointError
        When the file is missing, truncated or not a checkpoint of this format.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        with np.load(path, allow_pickle=False) as stored:
            document = json.loads(bytes(stored["tree"]).decode())
            arrays = [stored[f"a{i}"] for i in range(len(stored.files) - 1)]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or damaged?): "
                              f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else None
        raise CheckpointError(f"{path} has checkpoint format {found!r}; this asyncfl reads format {FORMAT}")
    return decode(document, arrays)


def find(location: str | Path) -> Path:
    """The checkpoint ``location`` names: a checkpoint file, a folder of them (the newest), or a run folder
    (the newest in its ``checkpoints/``).

    Raises
    ------
    CheckpointError
        When there is none there (saying where it looked).
    """
    location = Path(location).expanduser()
    if location.is_file():
        return location
    folders = [location / FOLDER, location]
    for folder in folders:
        found = listed(folder)
        if found:
            return found[-1]
    raise CheckpointError(f"no checkpoint in {location} (looked for checkpoint-v*-a*.npz in "
                          f"{' and '.join(str(f) for f in folders)})")


def newest_readable(location: str | Path) -> tuple[Path, dict, list[str]]:
    """The newest checkpoint at ``location`` (as :func:`find` names it) that reads, its tree, and one line for
    each newer one skipped as damaged (a crash mid-write leaves a truncated file only where the atomic rename
    was bypassed, e.g. a copied folder or a full disk).

    Raises
    ------
    CheckpointError
        When there is none, or none reads (the first one's problem).
    """
    newest = find(location)
    candidates = [newest] if Path(location).expanduser().is_file() else \
        [p for p in reversed(listed(newest.parent))]
    skipped: list[str] = []
    for path in candidates:
        try:
            return path, read(path), skipped
        except CheckpointError as exc:
            skipped.append(str(exc))
    raise CheckpointError(skipped[0] if len(skipped) == 1 else
                          f"no checkpoint in {newest.parent} reads: " + "; ".join(skipped))


def listed(folder: Path) -> list[Path]:
    """The checkpoints in ``folder``, oldest first (by arrivals, then version)."""
    if not folder.is_dir():
        return []
    named = [(_NAME.match(p.name), p) for p in folder.iterdir()]
    return [p for m, p in sorted(((m, p) for m, p in named if m), key=lambda mp: (int(mp[0][2]), int(mp[0][1])))]


#: Settings a checkpoint must share with the run resuming from it (what the saved state means depends on them);
#: stops, waits and timeouts may change (e.g. resume a finished run with a later stop).
#: Settings that checkpoints written before EngineConfig took RunOptions' names recorded under another name.
FORMER_SETTING_NAMES = {"eval_every": "evaluate_every_time", "eval_every_rounds": "evaluate_every",
                        "overlap": "overlap_server_compute", "delays": "delay_model"}


def resume_settings(config) -> dict:
    """The engine settings a checkpoint records and a resumed run must match (``config``: an EngineConfig; the
    fields it marks to match on resume)."""
    return {name: getattr(config, name) for name in config.resume_fields()} | {"delay_model": repr(config.delay_model)}


#: Settings a resumed run takes from its checkpoint, with the least valid value of each.
WHOLE_SETTINGS = {"concurrency": 1, "round_arrivals": 0}
#: Settings added after checkpoints were first written, at the value that reproduces the runs before them.
SETTINGS_BEFORE_THEY_EXISTED = {"update_norm_bound": 0.0, "update_norm_action": "clip", "dispatch_hold": 0.0,
                                "tail_average_rounds": 1}


def saved_settings(tree: dict, say: bool = False) -> dict:
    """A checkpoint's recorded settings under today's names (older checkpoints used former ones, and lack the
    settings added since: those count at the value that reproduces the run that wrote them); ``say``: log, in one
    line, which former names were read as which."""
    former = [name for name in tree["settings"] if name in FORMER_SETTING_NAMES]
    if former and say:  # once per resume (the run reads the settings more than once)
        log.info("the checkpoint names %s by former name(s): read as %s", ", ".join(former),
                 ", ".join(FORMER_SETTING_NAMES[name] for name in former))
    saved = {FORMER_SETTING_NAMES.get(name, name): value for name, value in tree["settings"].items()}
    for name, least in WHOLE_SETTINGS.items():  # a resumed run takes these from the file: it must hold numbers
        value = saved.get(name, least)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise CheckpointError(f"the checkpoint's {name} is {value!r}, not a whole number >= {least}: the file "
                                  "was changed or is damaged; resume from another checkpoint")
    return {**SETTINGS_BEFORE_THEY_EXISTED, **saved}


def layout_of(codec) -> dict:
    """The model layout a checkpoint records: names, shapes, dtypes."""
    return {"names": list(codec.names), "shapes": [[int(n) for n in s] for s in codec.shapes],
            "dtypes": [str(d) for d in codec.dtypes]}


def check_fits(tree: dict, strategy, codec, config, trusted: bool = False) -> None:
    """Refuse a checkpoint made by another strategy, model layout or scheduling settings, or with (or without) a
    ``trusted_train_fn`` where this run has none (or one: ``trusted``), saying what differs.

    Raises
    ------
    CheckpointError
        Naming each difference.
    """
    strategy.check_state(tree["strategy"])
    saved, ours = tree["layout"], layout_of(codec)
    if saved != ours:
        differ = [f"{n}: {s} {d} there" for n, s, d in zip(saved["names"], saved["shapes"], saved["dtypes"])
                  if [n, s, d] not in [list(t) for t in zip(ours["names"], ours["shapes"], ours["dtypes"])]]
        raise CheckpointError(f"the checkpoint's model layout differs from initial_arrays' ({len(saved['names'])} "
                              f"vs {len(ours['names'])} arrays; {'; '.join(differ[:3]) or 'order differs'})")
    settings, saved = resume_settings(config), saved_settings(tree)
    differ = [f"{k}={saved.get(k)!r} there, {v!r} here" for k, v in settings.items() if saved.get(k) != v]
    if differ:
        raise CheckpointError("the checkpoint was made with other run settings: " + "; ".join(differ))
    had = "trusted_direction" in tree.get("parts", {})
    if had != trusted:
        raise CheckpointError("the checkpoint's run " + ("checked" if had else "did not check") + " each update "
                              "against a trusted_train_fn and this one " + ("does not" if had else "does") +
                              ": resume with the same setting (the defence cannot change in mid-run)")


def journal_of(path: Path) -> Path:
    """The journal that goes with checkpoint ``path``: the events accepted after it (wall clock)."""
    return path.with_name(path.name.replace("checkpoint-", "journal-").replace(".npz", ".npy"))


def read_journal(path: Path) -> list[tuple[dict, list[np.ndarray]]]:
    """The events of the journal of checkpoint ``path``, in order: ``(header, arrays)``. A record cut short by the
    crash (the last one) is dropped: it was being written when the process died."""
    journal = journal_of(path)
    events: list[tuple[dict, list[np.ndarray]]] = []
    if not journal.exists():
        return events
    with open(journal, "rb") as handle:
        while True:
            try:
                header = json.loads(bytes(np.load(handle, allow_pickle=False)).decode())
                arrays = [np.load(handle, allow_pickle=False) for _ in range(header["arrays"])]
            except (ValueError, EOFError, OSError, json.JSONDecodeError, KeyError):
                break
            events.append((header, arrays))
    return events


class Checkpoints:
    """Writes the engine's state every ``every`` server versions into ``folder``, keeping the last ``keep``.

    With :attr:`journaling` (the wall clock, where a reply cannot be had again) every event the
    engine accepts after a checkpoint is appended to that checkpoint's journal, so a resumed run
    replays them and no accepted update is lost between checkpoints.

    Parameters
    ----------
    folder : Path
        Where checkpoint files go (created on the first write).
    every : int
        Server versions between checkpoints (>= 1).
    keep : int
        How many of the newest files to keep (>= 1).
    """

    def __init__(self, folder: Path, every: int, keep: int) -> None:
        self.folder = Path(folder)
        self.every = every
        self.keep = keep
        self.last_version = 0
        self.written = 0
        self.seconds = 0.0
        self.last_bytes = 0
        self.journaling = False  # wall clock: also log every accepted event between checkpoints (see record)
        self._journal = None

    def due(self, version: int) -> bool:
        """Whether ``version`` is ``every`` or more versions past the last checkpoint."""
        return version - self.last_version >= self.every

    def save(self, state: Callable[[], dict], version: int, arrivals: int) -> Path:
        """Write the tree ``state()`` makes as one checkpoint (its cost timed from the capture on)."""
        started = time.perf_counter()
        tree = state()
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"checkpoint-v{version:06d}-a{arrivals:08d}.npz"
        self.last_bytes = write(path, tree)
        if self.journaling:
            self.close()
            self._journal = open(journal_of(path), "wb")
        for old in listed(self.folder)[: -self.keep]:
            old.unlink(missing_ok=True)
            journal_of(old).unlink(missing_ok=True)
        for partial in self.folder.glob("checkpoint-*.npz.partial"):  # left by a crash while writing
            partial.unlink(missing_ok=True)
        self.last_version = version
        self.written += 1
        self.seconds += time.perf_counter() - started
        return path

    def record(self, header: dict, *arrays: np.ndarray) -> None:
        """Append one event to the newest checkpoint's journal (a no-op before the first checkpoint).

        Each write reaches the operating system at once (no fsync: a killed process loses nothing
        written; a power cut may lose the journal's tail, never a checkpoint).
        """
        if self._journal is None:
            return
        np.save(self._journal, np.frombuffer(json.dumps({**header, "arrays": len(arrays)}).encode(), dtype=np.uint8))
        for array in arrays:
            np.save(self._journal, np.ascontiguousarray(array))
        self._journal.flush()

    def close(self) -> None:
        """Close the open journal."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def summary(self) -> dict:
        """For ``summary.json``: how many were written, their mean cost, the last one's size and what the kept ones
        take on disk (MB = 10^6 bytes, as ``ls -l --si`` and file browsers count)."""
        if not self.written:
            return {}
        kept = listed(self.folder)
        on_disk = sum(p.stat().st_size for p in kept + [journal_of(p) for p in kept] if p.exists())
        return {"checkpoints-written": self.written,
                "checkpoint-ms-mean": round(1000.0 * self.seconds / self.written, 2),
                "checkpoint-mb": round(self.last_bytes / 1e6, 3),
                "checkpoints-kept": len(kept), "checkpoints-kept-mb": round(on_disk / 1e6, 3)}
