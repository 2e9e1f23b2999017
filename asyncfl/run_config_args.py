"""``asyncfl run``'s ``-c`` arguments: TOML files and ``key=value`` pairs merged in order, and checked.

Flower's ``flwr run`` reads each ``--run-config`` argument on its own and refuses a TOML
file beside ``key=value`` pairs; asyncfl merges them itself (a later one wins) and hands
``flwr run`` one string. Every check here runs before a SuperLink or Ray starts and fails
in one line naming the key as the user wrote it (and its file).
"""

from __future__ import annotations

import re
from pathlib import Path

from asyncfl.deploy.builtin_app import is_builtin_app
from asyncfl.errors import ConfigError


def app_defaults(app_dir: Path) -> dict:
    """The flat run-config a Flower app declares (its ``pyproject.toml``'s ``[tool.flwr.app.config]``, as Flower
    reads it)."""
    from flwr.common.config import flatten_dict, get_project_config

    return flatten_dict(get_project_config(app_dir)["tool"]["flwr"]["app"]["config"])


def run_config_sources(run_config: list[str]) -> list[tuple[str | None, dict]]:
    """Each ``-c`` argument as ``(its TOML file, or None for key=value pairs; its flat keys)``, in order.

    Raises
    ------
    ConfigError
        In one line, for a file that cannot be read or a pair Flower's parser would refuse.
    """
    return [(item, _read_toml(item)) if item.endswith(".toml") else (None, parse_pairs(item)) for item in run_config]


def _read_toml(path: str) -> dict:
    import tomllib

    from flwr.common.config import flatten_dict

    try:
        with open(Path(path).expanduser(), "rb") as handle:
            return flatten_dict(tomllib.load(handle))
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


#: how Flower's ``parse_config_args`` finds ``key=value`` pairs in an argument (flwr.common.config); text outside
#: its matches is dropped by Flower without a word
FLOWER_PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


def unread_text(item: str) -> str:
    """What of ``item`` Flower's pattern reads into no pair (``"strategy = 'x'"``, a bare ``seed``)."""
    return FLOWER_PAIR.sub(" ", item).strip()


def parse_pairs(item: str) -> dict:
    """One ``-c "key=value ..."`` argument, read by Flower's own parser (as ``flwr run`` reads it).

    Raises
    ------
    ConfigError
        For a value TOML cannot read (``strategy=fedasync``: Flower refuses it too), saying how to write it;
        for an argument with no ``key=value`` in it, which Flower would drop without a word.
    """
    import click
    from flwr.common.config import parse_config_args

    try:
        pairs = parse_config_args([item])
    except click.ClickException:
        raise ConfigError(_bad_pair_message(item)) from None
    if item.strip() and not pairs:
        raise ConfigError(f"-c {item!r} has no key=value pair: write key=value with no spaces around '=', "
                         "e.g. -c max-arrivals=600")
    left = unread_text(item)
    if left:
        raise ConfigError(f"-c {item!r}: {left!r} is no key=value pair (flwr run would drop it): write key=value "
                         "with no spaces around '=', e.g. -c \"max-arrivals=600 strategy='fedasync'\"")
    return pairs


def _bad_pair_message(item: str) -> str:
    import tomllib

    for token in item.split():
        key, _, value = token.partition("=")
        if not value or value[0] in "'\"":
            continue
        try:
            tomllib.loads(f"v = {value}")
        except tomllib.TOMLDecodeError:
            if value.lower() in ("true", "false"):
                return f"{token}: TOML booleans are lowercase: -c {key}={value.lower()}"
            return f"{token}: a string value needs quotes (as for flwr run): -c \"{key}='{value}'\""
    return (f"-c {item!r} is not key=value pairs TOML can read: numbers, true/false, or quoted strings "
            "such as -c \"strategy='fedasync'\"")


def app_overrides(app_dir: Path, run_config: list[str],
                  known: dict | None = None) -> tuple[list[tuple[str | None, dict]], dict]:
    """The ``-c`` arguments' sources and their merged overrides for the app in ``app_dir``. For asyncfl's built-in
    app, a key under an old name (:data:`asyncfl.options.RENAMED_KEYS`) that its pyproject has under the new one
    is read as the new one (said in one line); another app's keys are its own. What ``flwr run`` gets
    (:func:`flwr_run_config`) and what is checked are the same. ``known``: the app's flat run-config, if the
    caller has read it."""
    from asyncfl.options import current_keys

    sources = run_config_sources(run_config)
    merged = merge_run_config(sources)
    if not is_builtin_app(app_dir):
        return sources, merged
    if known is None:
        known = app_defaults(app_dir)
    return sources, current_keys(merged, where="-c", known=known)


def merge_run_config(sources: list[tuple[str | None, dict]]) -> dict:
    """Every source's keys in one dict, a later source's value winning."""
    merged: dict = {}
    for _, keys in sources:
        merged.update(keys)
    return merged


def _origin(sources: list[tuple[str | None, dict]], key: str) -> str:
    """Where ``key``'s value comes from, as a message's prefix: ``"conf/x.toml: "``, or "" for ``-c key=value``."""
    file = next((label for label, keys in reversed(sources) if key in keys), None)
    return f"{file}: " if file else ""


def flwr_run_config(overrides: dict) -> list[str]:
    """``overrides`` as the ``--run-config`` arguments of ``flwr run``: one string of ``"key"=value`` pairs.

    One string, keys quoted: Flower reads each argument as TOML on its own and merges them shallowly, so
    ``fedbuff.buffer-size`` in one argument and ``fedbuff.server-lr`` in another would drop the first, and
    ``model`` next to an unquoted ``model.batchnorm`` is a TOML error.
    """
    from asyncfl.server_app.run_folder import toml_value

    pairs = []
    for key, value in overrides.items():
        if not isinstance(value, (bool, int, float, str)):
            raise ConfigError(f"{key}={value!r}: a run-config value is a number, true/false or a string")
        text = toml_value(value)
        if isinstance(value, str) and '"' in value:  # Flower's pattern reads a double-quoted value up to its next "
            if "'" in value or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
                raise ConfigError(f"{key}={value!r}: flwr run cannot take a value with a double quote beside a "
                                 "single quote or a control character")
            text = f"'{value}'"
        pairs.append(f'"{key}"={text}')
    return [" ".join(pairs)] if pairs else []


# ---------------------------------------------------------------- checks
def unknown_key_message(key: str, known: dict) -> str:
    """One line for a run-config key the app does not have, with the nearest keys it does."""
    import difflib

    near = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(k) for k in near)}?" if near else \
        "every key is listed under [tool.flwr.app.config] in the app's pyproject.toml"
    return f"unknown key {key!r}: {hint}"


def check_node_count(fused: dict, num_supernodes: int) -> None:
    """Refuse a simulation whose nodes cannot fill the built-in app's concurrency (each node runs
    ``jobs-per-client`` jobs at once): it would wait ``wait-for-nodes`` for nodes that never come, then run
    fewer jobs in flight than asked for."""
    from asyncfl.options import RunOptions
    from asyncfl.strategies.registry import STRATEGY_CLASSES

    if str(fused.get("strategy")) not in STRATEGY_CLASSES:  # the gossip methods run every peer, no concurrency
        return
    concurrency = int(fused["concurrency"])
    per_node = int(fused.get("jobs-per-client", RunOptions.jobs_per_client))
    if num_supernodes * per_node < concurrency:
        fits = num_supernodes * per_node
        raise ConfigError(f"--num-supernodes {num_supernodes} cannot fill concurrency={concurrency} ({per_node} job "
                         f"per node at once): pass --num-supernodes >= {-(-concurrency // per_node)} or "
                         f"-c concurrency={fits}")


def refuse_ignored_settings(sources: list[tuple[str | None, dict]], strategy: str) -> None:
    """Refuse a knob of another strategy than the run's (:func:`asyncfl.config.foreign_settings`), from a TOML
    file as from ``key=value``: the run would ignore it.

    A file's knobs of the strategy the file names itself come with it: ``-c conf/paper/fedrevive-fmnist.toml
    -c "strategy='afl-dw'"`` runs the preset's setting with AFL-DW, its FedRevive knobs unused, as asked.

    Raises
    ------
    ConfigError
        Naming the key as set (and its file), the strategies it belongs to and the run's.
    """
    from asyncfl.config import ConfigError, foreign_settings, other_strategy_message

    merged = merge_run_config(sources)
    for key, owners in sorted(foreign_settings(merged, strategy).items()):
        named = next((keys.get("strategy") for label, keys in reversed(sources) if key in keys and label), None)
        if named not in owners:
            raise ConfigError(_origin(sources, key) + other_strategy_message(key, merged[key], owners, strategy))


def check_run_config(app_dir: Path, run_config: list[str], num_supernodes: int | None = None) -> dict:
    """Validate the fused run-config here, before a SuperLink or Ray starts.

    ``run_config`` are the ``-c`` arguments: TOML files and ``key=value`` pairs, later ones winning.
    Flower itself rejects unknown keys of any app; the values are checked only for
    asyncfl's built-in app, whose keys this module knows: a knob that another
    strategy than the run's would ignore is refused too.

    Returns the fused run-config. Raises :class:`asyncfl.ConfigError` (a ``ValueError``) for an unknown key,
    bad TOML or an invalid value, naming what is valid.
    """
    from flwr.common.config import get_fused_config_from_dir

    known = app_defaults(app_dir)
    sources, overrides = app_overrides(app_dir, run_config, known)
    for key in overrides:
        if key not in known:
            raise ConfigError(_origin(sources, key) + unknown_key_message(key, known))
    fused = get_fused_config_from_dir(app_dir, overrides)
    if is_builtin_app(app_dir):
        from asyncfl.config import parse_run_config

        parse_run_config(fused)
        refuse_ignored_settings(sources, str(fused["strategy"]))
        if num_supernodes is not None:
            check_node_count(fused, num_supernodes)
    return fused
