"""Each strategy's own configuration: a frozen dataclass beside the strategy class.

A strategy's constructor keywords are the fields of its config dataclass; their
bounds and choices sit in the field's metadata (:func:`knob`) and are checked once,
in ``__post_init__``, whether the values came from Python keywords or from the
built-in app's run-config. The run-config key of a field is
``<prefix>.<field-name-in-kebab-case>`` (``fedbuff.buffer-size``) unless the field
names another key (``fedavg.server-lr``, shared by the FedAvg-based baselines).

Fields marked ``builtin=True`` are the built-in app's data choices (which unlabeled
set FedEcho distils on, how much of the training split FedADT's server keeps): a
library user passes the data itself instead, so they are not constructor keywords.

This module imports no torch and no strategy, so a ClientApp can validate the
shared keys without loading the server-side methods.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Mapping, TypeVar, get_type_hints

from asyncfl.errors import ConfigError  # noqa: F401 (re-exported: strategies raise it from here)

C = TypeVar("C", bound="Knobs")
_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def knob(default: Any, *, minimum: float | None = None, maximum: float | None = None, above: float | None = None,
         below: float | None = None, choices: tuple[str, ...] | None = None, key: str | None = None,
         builtin: bool = False) -> Any:
    """A config field with its valid range.

    Parameters
    ----------
    default : Any
        The method's default (its paper's where the paper gives one).
    minimum, maximum : float, optional
        Inclusive bounds.
    above, below : float, optional
        Exclusive bounds.
    choices : tuple of str, optional
        The valid values of a string knob.
    key : str, optional
        A run-config key outside the strategy's own prefix (full dotted key), or another
        name under it (no dot).
    builtin : bool
        The built-in app's data choice, not a constructor keyword.
    """
    meta = {"minimum": minimum, "maximum": maximum, "above": above, "below": below, "choices": choices,
            "key": key, "builtin": builtin}
    return field(default=default, metadata={k: v for k, v in meta.items() if v is not None and v is not False})


def _describe_range(meta: Mapping[str, Any]) -> str:
    low = f">= {meta['minimum']}" if "minimum" in meta else f"> {meta['above']}" if "above" in meta else ""
    high = f"<= {meta['maximum']}" if "maximum" in meta else f"< {meta['below']}" if "below" in meta else ""
    return " and ".join(part for part in (low, high) if part)


def _parameters(doc: str | None) -> list[tuple[list[str], str]]:
    """The entries of a numpy-style docstring's ``Parameters`` section: ``([names], description on one line)``."""
    if not doc or "Parameters\n" not in inspect.cleandoc(doc):
        return []
    section = inspect.cleandoc(doc).split("Parameters\n", 1)[1].split("\n", 1)[1]  # past the dashes
    section = re.split(r"\n\n(?=[A-Z][a-z]+\n-+\n)", section)[0]  # up to the next section
    entries: list[tuple[list[str], list[str]]] = []
    for line in section.splitlines():
        heading = re.match(r"^(\w+(?:, \w+)*) :", line)
        if heading:
            entries.append(([name.strip() for name in heading.group(1).split(",")], []))
        elif line[:1] not in ("", " "):  # an unindented line that names no parameter: the section has ended
            break
        elif entries and line.strip():
            entries[-1][1].append(line.strip())
    return [(names, " ".join(text)) for names, text in entries]


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
    return not (("minimum" in meta and value < meta["minimum"]) or ("maximum" in meta and value > meta["maximum"])
                or ("above" in meta and value <= meta["above"]) or ("below" in meta and value >= meta["below"]))


@dataclass(frozen=True)
class Knobs:
    """Base of the knob dataclasses (each strategy's config, the run options).

    Subclasses set :attr:`label` (the name users see) and :attr:`prefix` (the run-config
    table; empty for top-level keys), declare fields with :func:`knob` and may override
    :meth:`check` for conditions that tie fields together.
    """

    label: ClassVar[str] = "knobs"
    prefix: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for spec in fields(self):
            value = self._typed(spec.name, getattr(self, spec.name), hints[spec.name])
            object.__setattr__(self, spec.name, value)
            meta = spec.metadata
            if "choices" in meta and value not in meta["choices"]:
                self.fail(spec.name, f"is not valid; choose one of: {', '.join(meta['choices'])}")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not _in_range(value, meta):
                self.fail(spec.name, f"must be {_describe_range(meta)}")
        self.check()

    def check(self) -> None:
        """Conditions between fields; raise with :meth:`fail`."""

    # ------------------------------------------------------------------ naming
    @classmethod
    def key_of(cls, name: str) -> str:
        """The run-config key of field ``name``."""
        spec = next(f for f in fields(cls) if f.name == name)
        key = spec.metadata.get("key", name.replace("_", "-"))
        return key if "." in key or not cls.prefix else f"{cls.prefix}.{key}"

    def fail(self, name: str, problem: str) -> None:
        """Raise :class:`ConfigError` about field ``name`` (its keyword and its run-config key)."""
        raise ConfigError(f"{self.label}: {name}={getattr(self, name)!r} {problem} "
                          f"(run-config {self.key_of(name)})")

    def _typed(self, name: str, value: Any, hint: Any) -> Any:
        wanted = _TYPES.get(hint if isinstance(hint, str) else getattr(hint, "__name__", ""))
        if wanted is None:
            return value
        if wanted is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                self.fail(name, "must be a finite number")
            return float(value)
        if wanted is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, wanted) and not (wanted is int and isinstance(value, bool)):
            return value
        raise ConfigError(f"{self.label}: {name}={value!r} must be {wanted.__name__} "
                          f"(run-config {self.key_of(name)})")

    # -------------------------------------------------------------- conversion
    @classmethod
    def from_run_config(cls: type[C], run_config: Mapping[str, Any]) -> C:
        """Read every field from Flower's flat run-config (a missing key takes the field's default)."""
        values = {spec.name: run_config[cls.key_of(spec.name)] for spec in fields(cls)
                  if cls.key_of(spec.name) in run_config}
        config = cls(**values)
        config.check_run_config(run_config)
        return config

    @classmethod
    def from_arguments(cls: type[C], arguments: Mapping[str, Any], declared_by: "type[Knobs] | None" = None) -> C:
        """The config of one constructor call: each constructor keyword (every field but the built-in app's data
        choices) read from ``arguments``, the constructor's ``locals()``, so that a knob is passed on without being
        spelled again; a keyword the constructor lacks is named (a knob must be one). ``declared_by``: read only
        that config's fields (a base strategy building a subclass's config, whose further fields keep their
        defaults)."""
        names = [spec.name for spec in fields(declared_by or cls) if not spec.metadata.get("builtin")]
        missing = [name for name in names if name not in arguments]
        if missing:
            raise TypeError(f"{cls.__name__}: the strategy's constructor has no keyword {', '.join(missing)}; every "
                            "knob is a keyword of it")
        return cls(**{name: arguments[name] for name in names})

    def check_run_config(self, run_config: Mapping[str, Any]) -> None:
        """Conditions on the built-in app's other keys (its dataset, its server hold-out); none by default."""

    def keywords(self) -> dict[str, Any]:
        """The constructor keywords (every field but the built-in app's data choices)."""
        return {spec.name: getattr(self, spec.name) for spec in fields(self) if not spec.metadata.get("builtin")}

    def to_run_config(self) -> dict[str, Any]:
        """``{run-config key: value}`` for every field."""
        return {self.key_of(spec.name): getattr(self, spec.name) for spec in fields(self)}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """``{field: default}``."""
        return {spec.name: spec.default for spec in fields(cls) if spec.default is not MISSING}

    @classmethod
    def described(cls) -> list[dict[str, str]]:
        """One row per field, from its declaration alone: run-config ``key``, ``keyword``, ``type``, ``default``,
        ``valid`` values and ``help``, the field's entry under ``Parameters`` in the docstring of its class (or of
        the nearest base class that documents it)."""
        helps: dict[str, str] = {}
        for klass in cls.__mro__:
            for names, text in _parameters(klass.__dict__.get("__doc__")):
                shared = f"(with {', '.join(f'``{n}``' for n in names)}) " if len(names) > 1 else ""
                for name in names:
                    helps.setdefault(name, shared + text)
        hints = get_type_hints(cls)
        rows = []
        for spec in fields(cls):
            meta = spec.metadata
            valid = ", ".join(map(repr, meta["choices"])) if "choices" in meta else _describe_range(meta)
            default = "" if spec.default is MISSING else repr(spec.default)
            hint = hints[spec.name]
            rows.append({"key": cls.key_of(spec.name), "keyword": spec.name,
                         "type": getattr(hint, "__name__", str(hint)), "default": default, "valid": valid,
                         "help": helps.get(spec.name, ""), "builtin": "yes" if meta.get("builtin") else ""})
        return rows


@dataclass(frozen=True)
class StrategyConfig(Knobs):
    """Base of the per-strategy config dataclasses (run-config table ``<prefix>.*``)."""

    label: ClassVar[str] = "strategy"
