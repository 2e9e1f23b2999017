"""``asyncfl run --resume``: the resumed run's run-config and node count, every check before anything is written.

A resume goes on with the run-config the run was started with; ``-c`` may change only
:data:`RESUMABLE_KEYS`. Each refusal is one line, before a SuperLink or Ray starts (the
ServerApp's own check, :func:`asyncfl.server_app.checkpoint.check_fits`, stays the backstop).
"""

from __future__ import annotations

import sys
from pathlib import Path

from asyncfl.errors import ConfigError
from asyncfl.run_config_args import merge_run_config, run_config_sources, unknown_key_message

#: Run-config keys ``--resume`` may change: the stops, the waits and timeouts, the progress line and where the
#: same data files are. Every other key shapes what the checkpoint's state means.
RESUMABLE_KEYS = ("max-arrivals", "max-time", "timeout", "wait-for-nodes", "progress", "data-dir")
#: simulated clients where neither ``--num-supernodes`` nor the run's summary says
DEFAULT_SUPERNODES = 50


def resume_run_config(folder: Path, overrides: list[str], num_supernodes: int | None = None) -> tuple[dict, int]:
    """The run-config and node count to resume ``folder`` with, checked; nothing is written.

    The run-config is the one the run was started with, ``overrides`` (``key=value`` of
    :data:`RESUMABLE_KEYS` only) applied, ``resume-from`` and the run folder set; the node
    count is the run's own (its summary's ``clients``), which ``num_supernodes`` may only repeat.

    Raises
    ------
    ConfigError
        In one line: not a run folder, no checkpoint, a key the resume cannot change (named as
        written, with the keys it may change), another node count, or what the checkpoint refuses.
    """
    from asyncfl.server_app import checkpoint
    from asyncfl.server_app.run_folder import RUN_CONFIG_FILE, read_run_config

    folder = folder.expanduser().resolve()
    if not (folder / RUN_CONFIG_FILE).exists():
        raise ConfigError(f"no {RUN_CONFIG_FILE} in {folder}: not a run folder of the built-in app (a library run "
                         "resumes with start(..., resume_from=...))")
    checkpoint.find(folder)  # says so now if there is none
    if any(item.endswith(".toml") for item in overrides):
        raise ConfigError("with --resume, -c takes key=value changes only (the run's own run-config is the file)")
    from asyncfl.options import current_keys

    saved = current_keys(read_run_config(folder), where=str(folder / RUN_CONFIG_FILE))  # a run stored before a rename
    changes = current_keys(merge_run_config(run_config_sources(overrides)), where="-c")
    try:
        refuse_resume_changes(saved, changes)
        refuse_finished_unchanged(folder, saved, changes)
        nodes = resumed_node_count(folder, num_supernodes)
        run_config = {**saved, **changes,
                      "resume-from": str(folder), "output-dir": str(folder.parent), "run-name": folder.name}
        check_resumable(folder, run_config)
    except (KeyError, TypeError, AttributeError) as exc:  # a damaged folder, or one another version wrote
        raise ConfigError(f"{folder} cannot be resumed: its run_config.toml, summary.json or checkpoint lacks "
                         f"what this asyncfl needs ({type(exc).__name__}: {exc})") from None
    return run_config, nodes


def run_summary(folder: Path) -> dict:
    """The run's ``summary.json``, ``{}`` where there is none or it is not a JSON object."""
    import json

    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def refuse_resume_changes(saved: dict, changes: dict) -> None:
    """Refuse a change the resumed run cannot take: a key outside :data:`RESUMABLE_KEYS` set to another value
    than the run's (the ServerApp would refuse it only once the SuperLink and Ray run), or an unknown key."""
    from asyncfl.config import same_value

    for key, value in changes.items():
        if key not in saved:
            raise ConfigError(unknown_key_message(key, saved))
        if key not in RESUMABLE_KEYS and not same_value(saved[key], value):
            raise ConfigError(f"{key}={value!r} cannot change on resume (the run has {key}={saved[key]!r}); a resume "
                             f"may change only {', '.join(RESUMABLE_KEYS)}")


#: the stops a finished run can be taken past
STOP_KEYS = ("max-arrivals", "max-time")


def refuse_finished_unchanged(folder: Path, saved: dict, changes: dict) -> None:
    """Refuse resuming a run that finished (its summary's ``finished``: one of its own stops was reached) unless a
    stop is moved past what the run reached (or off, 0): else it would start a SuperLink and Ray, send jobs, and
    stop again at once."""
    from asyncfl.config import same_value

    ended = run_summary(folder)
    if ended.get("finished") is not True:
        return  # interrupted, failed, killed, or no summary: the checkpoint goes on
    reached = {"max-arrivals": ended.get("arrivals"), "max-time": ended.get("final-time")}
    for key in STOP_KEYS:
        if key in changes and not same_value(saved.get(key), changes[key]):
            value, done = changes[key], reached[key]
            if value == 0 or not isinstance(done, (int, float)) or value > done:
                return
    limits = " or ".join(f"{key}={saved[key]!r}" for key in STOP_KEYS if saved.get(key))
    raise ConfigError(f"the run finished ({ended.get('stop-reason', 'its stop reached')}): nothing to resume; to go "
                     f"on past its stop, raise it: -c {STOP_KEYS[0]}=<more than {ended.get('arrivals', '?')}>"
                     + (f" (it stops at {limits})" if limits else ""))


def resumed_node_count(folder: Path, asked: int | None) -> int:
    """The resumed run's simulated clients: its summary's ``clients``; ``asked`` (``--num-supernodes``) may only
    repeat it (the partitions and the schedule depend on it)."""
    clients = run_summary(folder).get("clients")
    if clients is not None and (isinstance(clients, bool) or not isinstance(clients, int) or clients < 1):
        raise ConfigError(f"{folder / 'summary.json'} says clients={clients!r}, not a client count: pass "
                         "--num-supernodes with the run's own")
    if asked is not None and clients is not None and asked != clients:
        raise ConfigError(f"--num-supernodes {asked} cannot change on resume (the run has {clients} clients): leave "
                         "it out")
    return asked or clients or DEFAULT_SUPERNODES


def write_resume_run_config(folder: Path, run_config: dict) -> list[str]:
    """Write the checked ``run_config`` to ``<folder>/resume/run_config.toml`` (what the last resume ran with);
    returns ``flwr run``'s ``--run-config`` arguments: that file."""
    from asyncfl.server_app.run_folder import RUN_CONFIG_FILE, write_run_config

    resume_folder = folder.expanduser().resolve() / "resume"
    resume_folder.mkdir(exist_ok=True)
    write_run_config(resume_folder, run_config)
    return [str(resume_folder / RUN_CONFIG_FILE)]


def check_resumable(folder: Path, run_config: dict) -> None:
    """Refuse, here and now, a resume the ServerApp would refuse after the SuperLink and Ray started: a run-config
    that is not valid, or another strategy or other knobs than the newest readable checkpoint's. A damaged newest
    checkpoint is said and the older one that reads is the one checked (the ServerApp resumes from it too).

    Raises
    ------
    ConfigError
        :class:`asyncfl.errors.CheckpointError` or :class:`asyncfl.config.ConfigError`, saying what differs by its
        run-config key.
    """
    from asyncfl.config import parse_run_config
    from asyncfl.server_app import checkpoint
    from asyncfl.strategies.strategy_state import check_saved_strategy
    from asyncfl.strategies.registry import STRATEGY_CLASSES, strategy_class

    cfg = parse_run_config(run_config)
    path, tree, skipped = checkpoint.newest_readable(folder)
    for problem in skipped:
        print(f"asyncfl: {problem}: resuming from the newest one that reads, {path.name}", file=sys.stderr)
    if cfg.strategy in STRATEGY_CLASSES:
        check_saved_strategy(tree["strategy"], strategy_class(cfg.strategy).__qualname__, cfg.strategy_config)
