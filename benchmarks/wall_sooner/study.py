"""Sooner on the wall clock: Flower's examples through real ``flwr run`` on an emulated fleet whose devices differ.

Issue 59's study. Each run copies an example of ``examples/`` and changes only what a user would:
the strategy import (Flower's ``FedAvg``, asyncfl's ``FedBuff``, ``FedAsync`` or ``CA2FL``: the
swap of ``benchmarks/dropin/wall_clock.py``) and one mod added to the ClientApp,
``asyncfl.client_app.device_speed.device_speed`` (docs/device_speed.md), in **nominal** mode: node
*i* takes ``s_i × device-seconds`` of wall time per train job, waiting out what its handler did not
use, with the slowdowns ``s_i`` dealt by the profile (``quarter-5x-slower``: 2 of 8 nodes 5x
slower, the rest lognormal around 1). The emulated fleet's times are therefore fixed before the
run, and so is its **ideal update rate**: ``Σ_i 1 / (s_i × device-seconds)`` where every node always
holds a job (the quickstart: every node trains), else that of ``fraction-train`` × nodes jobs always out
(an event simulation; the advanced example: 12 of 50); a synchronous round's ideal time is its cohort's
slowest node's ``s_i × device-seconds`` (the expectation over random cohorts where it samples).

Two modes, the same app and settings:

- ``simulation``: ``asyncfl run`` (``flwr run`` on a private simulation SuperLink, Ray), with
  ``--cpus-per-client 1 --ray-cpus <cohort>`` (Flower's ``client-resources-num-cpus=1
  init-args-num-cpus=<cohort>``), so Ray starts one actor per job that can be out at once and a waiting
  node holds no actor another node's job needs (Flower gives a ClientApp whole CPUs only: a fraction is
  refused); Flower's runtime itself runs at most ``min(32, cores + 4)`` ClientApps at once;
- ``loopback``: a SuperLink and one SuperNode process per node on 127.0.0.1
  (``asyncfl.deploy.local.LocalDeployment``), ``flwr run`` against it.

The server-side evaluation is timed (the copy wraps ``evaluate_fn``: seconds since ``start()`` was
called, per evaluation), so a cell has its accuracy against wall time. asyncfl's own figures come from
``Result.summary`` (rejections by reason, lost replies, round trips, jobs in flight). A study-only mod outside the
others (``_stamped``) writes each train job's timing (its request made, the ClientApp's start and end, the device
time it reports), which splits a job's time between Flower's delivery, the ClientApp and the server
(``--split-table``). Cells are
appended to ``<out>/cells.jsonl`` as they finish; runs are interleaved over strategies (Flower's FedAvg
first in each run), so every strategy sees the machine in the same state, and a stopped study resumes.

Usage::

    .venv/bin/python benchmarks/wall_sooner/study.py --mode simulation --runs 3
    .venv/bin/python benchmarks/wall_sooner/study.py --table
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "dropin"))
sys.path.insert(0, str(ROOT))

from advanced_example import load  # noqa: E402  (the stored cells' reader)
from wall_clock import EXAMPLES as DROPIN_EXAMPLES  # noqa: E402
from wall_clock import FOLDER as DROPIN_FOLDER  # noqa: E402
from wall_clock import fmnist_subset, swapped  # noqa: E402

from asyncfl.client_app.device_speed import DeviceProfile  # noqa: E402

STRATEGIES = ("flower-fedavg", "fedbuff", "fedasync", "ca2fl")
#: the drop-in study's examples, and the advanced example with 6 jobs out at once (6 of 50 nodes a round), so that
#: Flower's simulation runtime on a 2-core host (min(32, cores + 4) = 6 ClientApps at once) does not cap the fleet
EXAMPLES = {**DROPIN_EXAMPLES,
            "advanced-pytorch-6-out": ("advancedexample/server_app.py", 50, "fraction-evaluate=0.0 fraction-train=0.12")}
FOLDER = {**DROPIN_FOLDER, "advanced-pytorch-6-out": "advanced-pytorch"}
MODES = ("simulation", "loopback")
#: the puller's settings an ablation may set: study name -> ThreadedPuller class attribute
PULLER_SETTINGS = {"cap": "MAX_INTERVAL", "fine": "FINE"}
EVALUATE = "evaluate_fn=global_evaluate"
CLIENT_APP = re.compile(r"^app = ClientApp\(mods=\[report_train_seconds\]\)", re.M)
TIMED = '''

def _timed(evaluate, path={path!r}):
    """The study's wrapper: each server-side evaluation's seconds since start() was called, with its accuracy and
    the host's busy CPU seconds then (/proc/stat, as study.host_cpu_seconds; None without it)."""
    import json as _json
    import os as _os
    import time as _time
    started = _time.monotonic()

    def host_cpu():
        try:
            with open("/proc/stat") as stat:
                user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in stat.readline().split()[1:8])
        except OSError:
            return None
        return round((user + nice + system + irq + softirq) / _os.sysconf("SC_CLK_TCK"), 2)

    def timed(server_round, arrays):
        began = _time.monotonic()
        metrics = evaluate(server_round, arrays)
        now = _time.monotonic()
        with open(path, "a") as out:
            out.write(_json.dumps({{"round": int(server_round), "t": round(now - started, 3),
                                   "accuracy": float(metrics["accuracy"]), "cpu": host_cpu(),
                                   "evaluation_s": round(now - began, 3)}}) + "\\n")
        return metrics
    return timed
'''
STAMPED = '''

def _stamped(msg, context, call_next, _path={path!r}):
    """The study's outermost mod: for each train job, the request's ``created_at`` (the ServerApp's moment of making
    it) and when the ClientApp got it, written as it starts; then also when the ClientApp was done with it and the
    device time its reply reports (``train-seconds``): JSON lines, the host's clock on both sides."""
    import json as _json
    import time as _time

    from asyncfl import protocol as _protocol

    def write(stamp):
        with open(_path, "a") as out:
            out.write(_json.dumps(stamp) + "\\n")

    train = msg.metadata.message_type.split(".")[0] == "train"  # "train" or "train.<action>"
    stamp = {{"created": msg.metadata.created_at, "began": _time.time(), "node": msg.metadata.dst_node_id}}
    if train:
        write(stamp)
    reply = call_next(msg, context)
    if train and reply.has_content():
        device = _protocol.train_seconds(_protocol.reply_metrics(reply.content))
        write({{**stamp, "ended": _time.time(), "device": None if device is None else round(float(device), 4)}})
    return reply
'''
SUMMARY = ("\n    _summary = getattr(result, 'summary', None)\n"
           "    if _summary is not None:\n"
           "        open({path!r}, 'w').write(_json.dumps(_summary, default=str))\n")


def server_source(source: str, strategy: str, timeline: Path, summary: Path, accuracy: Path,
                  start_options: str = "", puller: dict[str, float] | None = None) -> str:
    """``server_app.py`` with the strategy swapped (``start_options``: keywords for asyncfl's ``start()``), its
    evaluation timed and asyncfl's summary written; ``puller``: settings of the wall-clock puller by
    :data:`PULLER_SETTINGS` name (an ablation of its defaults)."""
    if strategy == "ca2fl":  # the swap knows FedAsync; CA2FL is the same one-name change
        source = re.sub(r"^(from asyncfl import [^\n]*)\bFedBuff\b", r"\1CA2FL as FedBuff", source, count=1, flags=re.M)
        strategy = "fedbuff"
    source = swapped(source, strategy, accuracy, start_options)
    if EVALUATE not in source:
        raise SystemExit(f"the example's server_app.py has no {EVALUATE!r}: update {Path(__file__).name}")
    source = source.replace(EVALUATE, "evaluate_fn=_timed(global_evaluate)", 1)
    source = source.rstrip("\n") + SUMMARY.format(path=str(summary)) + TIMED.format(path=str(timeline))
    if puller:
        source += "\nfrom asyncfl.server_app.puller import ThreadedPuller as _ThreadedPuller\n"
        source += "".join(f"_ThreadedPuller.{PULLER_SETTINGS[name]} = {float(value)!r}\n"
                          for name, value in sorted(puller.items()))
    return source


def client_source(source: str, stamps: Path | None = None) -> str:
    """``client_app.py`` with the ``device_speed`` mod added after ``report_train_seconds``; ``stamps``: also the
    study's ``_stamped`` mod outside both, writing each train job's timing there."""
    if not CLIENT_APP.search(source):
        raise SystemExit(f"the example's client_app.py has no {CLIENT_APP.pattern[1:]!r}: update {Path(__file__).name}")
    mods = "report_train_seconds, device_speed" if stamps is None else "_stamped, report_train_seconds, device_speed"
    added = ("from asyncfl.client_app.device_speed import device_speed\n"
             + ("" if stamps is None else STAMPED.format(path=str(stamps))) + f"\n\napp = ClientApp(mods=[{mods}])")
    return CLIENT_APP.sub(lambda _: added, source)  # a function: the mod's "\\n" must not become a line end


def declare_device_keys(pyproject: Path, profile: str, seconds: float, seed: int) -> None:
    """Declare the mod's run-config keys in the copy's ``[tool.flwr.app.config]`` (Flower refuses undeclared keys)."""
    text = pyproject.read_text()
    header = "[tool.flwr.app.config]\n"
    if header not in text:
        raise SystemExit(f"{pyproject} has no {header.strip()}: update {Path(__file__).name}")
    keys = f'device-profile = "{profile}"\ndevice-seconds = {seconds!r}\ndevice-seed = {seed}\n'
    pyproject.write_text(text.replace(header, header + keys, 1))


def ideal(profile: str, nodes: int, seconds: float, seed: int, in_flight: int | None = None) -> dict:
    """The emulated fleet's ideal update rate and a synchronous round's time.

    Asynchronous: ``in_flight`` jobs always out (default: every node holding one), a freed slot going to a node
    without a job; the sum of the nodes' rates when every node holds one, else an event simulation
    (``runtime_bound`` without a worker limit). Synchronous: the slowest node's time (of every node; a sampled
    cohort's expected slowest is ``sampled_rounds``'s).
    """
    fleet = DeviceProfile.parse(profile).fleet(nodes, seed)
    out = nodes if in_flight is None else min(in_flight, nodes)
    rate = (sum(1 / (s * seconds) for s in fleet) if out == nodes
            else runtime_bound(fleet, seconds, workers=nodes, in_flight=out))
    return {"fleet": [round(s, 3) for s in fleet], "ideal-updates-per-s": rate, "ideal-round-s": max(fleet) * seconds}


def sampled_rounds(fleet: list[float], seconds: float, cohort: int, workers: int, draws: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """(a round's expected ideal time, its expected time on ``workers``) when each round trains ``cohort`` nodes
    drawn at random from ``fleet`` (listed in partition order), as Flower's FedAvg samples them, their jobs queued
    in partition order: exact where the cohort is every node, else the mean over ``draws`` seeded draws."""
    if cohort >= len(fleet):
        return max(fleet) * seconds, round_bound(fleet, seconds, workers)
    rng = random.Random(seed)
    picks = [[fleet[i] for i in sorted(rng.sample(range(len(fleet)), cohort))] for _ in range(draws)]
    return (statistics.mean(max(p) * seconds for p in picks),
            statistics.mean(round_bound(p, seconds, workers) for p in picks))


def runtime_bound(fleet: list[float], seconds: float, workers: int, in_flight: int | None = None,
                  horizon: float = 20_000.0) -> float:
    """Updates per second when at most ``workers`` ClientApps run at once, first come first served.

    Flower's simulation runtime runs ClientApps on ``min(32, cores + 4)`` threads (a
    ``ThreadPoolExecutor()`` with Python's default size), whatever the number of Ray actors: on
    2 cores, 6 at once. Every node re-submits the moment its job ends (``in_flight`` < nodes: that
    many jobs out, the freed one going to the node idle longest: asyncfl draws it at random among the idle
    nodes, which gives the same long-run rate, within 1 % on the advanced example's fleet). An event
    simulation over ``horizon`` seconds; with ``workers`` >= the nodes it is the fleet's ideal rate.
    """
    import heapq

    times = [s * seconds for s in fleet]
    out = len(fleet) if in_flight is None else min(in_flight, len(fleet))
    waiting = list(range(out))  # FIFO of jobs not yet started (node ids)
    idle = list(range(out, len(fleet)))  # nodes without a job
    running: list[tuple[float, int]] = []
    now, done = 0.0, 0
    while True:
        while waiting and len(running) < workers:
            node = waiting.pop(0)
            heapq.heappush(running, (now + times[node], node))
        now, node = heapq.heappop(running)
        if now > horizon:
            return done / horizon
        done += 1
        if idle:  # the freed slot goes to the node that has waited longest for one
            idle.append(node)
            node = idle.pop(0)
        waiting.append(node)


def round_bound(jobs: list[float], seconds: float, workers: int) -> float:
    """A synchronous round's time when its ``jobs`` (slowdowns, in the order the runtime queues them) go to
    ``workers`` first come first served. Flower's simulation runtime queues a round's messages in its nodes'
    partition order (``vce_api.add_messages_to_queue`` walks the node-to-partition mapping), so a slow node late in
    that order can start only after earlier jobs free a worker."""
    import heapq

    ends = [0.0] * min(workers, len(jobs))
    for job in jobs:
        heapq.heappush(ends, heapq.heappop(ends) + job * seconds)
    return max(ends)


def host_cpu_seconds() -> float | None:
    """CPU seconds the host's cores have been busy since boot (``/proc/stat``: user, nice, system, irq, softirq;
    not steal, the time a hypervisor withheld), None where there is no ``/proc/stat``. On a host running nothing
    else, the difference over a run is the run's CPU: every process of it, the short-lived ClientApp processes a
    loopback SuperNode starts included. (The app copy's ``_timed`` reads the same at each evaluation.)"""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def puller_settings(puller: dict[str, float] | None = None) -> dict[str, float]:
    """The wall-clock puller's settings a run of this tree has: its defaults, with an ablation's ``puller`` over
    them (recorded in each asyncfl cell)."""
    from asyncfl.server_app.puller import ThreadedPuller

    return {name: float(getattr(ThreadedPuller, attribute)) for name, attribute in PULLER_SETTINGS.items()} \
        | {name: float(value) for name, value in (puller or {}).items()}


def stored_puller(cell: dict) -> dict[str, float]:
    """The puller settings an asyncfl cell ran with; cells from before the learned pull time record a cap only
    when it was ablated (default 1 s) and had no fine spacing (0: nothing learned)."""
    return {"cap": float(cell.get("puller-cap", 1.0)), "fine": float(cell.get("puller-fine", 0.0))}


def pin_code() -> None:
    """Make every process of a run (the SuperLink's ServerApp, Ray's ClientApps, the SuperNodes) import asyncfl from
    this study's own tree, not the editable install's: a study run from a pinned copy then runs the pinned code,
    whatever happens to the working tree meanwhile."""
    kept = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path and path != str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *kept])


#: A ``sitecustomize`` for ``--runtime-workers``: in Flower's simulation process only, a ThreadPoolExecutor that
#: Flower's runtime makes without a size (``vce_api.run_api``: one thread per Ray actor's worker, Python's default
#: ``min(32, cores + 4)``) gets ``{workers}`` threads, and appends its size to the mark file, which the study checks.
WIDE_RUNTIME = """import sys
if sys.argv and sys.argv[0].endswith("flwr-simulation"):
    import concurrent.futures.thread as _thread
    _made = _thread.ThreadPoolExecutor.__init__
    def _wide(self, max_workers=None, *args, **kwargs):
        runtime = max_workers is None and sys._getframe(1).f_code.co_filename.endswith("vce_api.py")
        _made(self, {workers} if runtime else max_workers, *args, **kwargs)
        if runtime:
            with open({mark!r}, "a") as _mark:
                _mark.write(str(self._max_workers) + "\\n")
    _thread.ThreadPoolExecutor.__init__ = _wide
"""


def widened_pools(mark: Path) -> list[int]:
    """The sizes :data:`WIDE_RUNTIME` gave the thread pools of Flower's runtime in a run's simulation process (none:
    the patch did not load, or Flower's runtime made no unsized pool)."""
    return [int(line) for line in mark.read_text().split()] if mark.exists() else []


def _run_simulation(app: Path, nodes: int, overrides: str, cwd: str, timeout: float,
                    actors: int | None = None, runtime_workers: int | None = None) -> tuple[int, str]:
    """``asyncfl run`` in simulation with ``actors`` Ray actors (default one per node): one per job that can be out
    at once, so that a node waiting out its device time holds no actor another node's job needs.
    ``runtime_workers``: Flower's runtime runs that many ClientApps at once instead of ``min(32, cores + 4)``
    (:data:`WIDE_RUNTIME`; a diagnosis of where the rate is capped, not a setting Flower offers)."""
    actors = nodes if actors is None else actors
    env = dict(os.environ)
    if runtime_workers is not None:
        site, mark = Path(cwd) / "wide-runtime", Path(cwd) / "wide-runtime.mark"
        site.mkdir()
        (site / "sitecustomize.py").write_text(WIDE_RUNTIME.format(workers=runtime_workers, mark=str(mark)))
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-m", "asyncfl.cli", "run", "--app", str(app), "--num-supernodes",
                           str(nodes), "--cpus-per-client", "1", "--ray-cpus", str(actors), "-c", overrides],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
    if runtime_workers is not None and runtime_workers not in widened_pools(Path(cwd) / "wide-runtime.mark"):
        return 1, ("--runtime-workers: Flower's runtime's thread pool was not widened (the patch did not load, or "
                   "Flower sizes that pool now)\n" + done.stdout + done.stderr)
    return done.returncode, done.stdout + done.stderr


def _run_loopback(app: Path, nodes: int, overrides: str, cwd: str, timeout: float,
                  actors: int | None = None, runtime_workers: None = None) -> tuple[int, str]:
    """``flwr run`` against a loopback deployment of ``nodes`` SuperNode processes (``actors`` unused: a SuperNode
    starts a ClientApp process per message)."""
    from asyncfl.deploy.local import LocalDeployment

    with LocalDeployment(app, nodes, workdir=Path(cwd) / "deploy") as deployment:
        flwr = deployment.submit([overrides])
        try:
            output, _ = flwr.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(flwr.pid, 15)
            output, _ = flwr.communicate(timeout=30)
            return 124, output
        return flwr.returncode, output


def run_cell(example: str, strategy: str, run: int, mode: str, profile: str, seconds: float, rounds: int,
             seed: int, start_options: str = "", async_rounds: int | None = None,
             puller: dict[str, float] | None = None, runtime_workers: int | None = None) -> dict:
    """One run of ``example`` with ``strategy`` on the emulated fleet; the cell with its timed accuracy curve.

    ``rounds`` is the equal-work point (Flower's FedAvg runs that many); an asynchronous strategy runs
    ``async_rounds`` (default ``rounds``), so its curve goes on past equal work and the time it takes to
    reach FedAvg's final accuracy can be read from it; ``final`` is read at ``rounds`` either way.
    """
    module, nodes, overrides = EXAMPLES[example]
    run_rounds = rounds if strategy == "flower-fedavg" or async_rounds is None else async_rounds
    if run_rounds < rounds:
        raise SystemExit(f"--async-rounds {run_rounds} < --rounds {rounds}: the equal-work point would not be reached")
    overrides = re.sub(r"num-server-rounds=\d+ ?", "", overrides) + f" num-server-rounds={run_rounds}"
    if "{subset}" in overrides:
        overrides = overrides.replace("{subset}", str(fmnist_subset(ROOT / "benchmarks" / "dropin" / ".fmnist-subset")))
    cohort = _cohort(example, nodes)
    with tempfile.TemporaryDirectory() as folder:
        app = Path(folder) / example
        shutil.copytree(ROOT / "examples" / FOLDER.get(example, example), app,
                        ignore=shutil.ignore_patterns(".flwr", "*.pt", "outputs"))
        timeline, summary, accuracy = (Path(folder) / name for name in ("timeline.jsonl", "summary.json",
                                                                        "accuracy.json"))
        server_app = app / module
        server_app.write_text(server_source(server_app.read_text(), strategy, timeline, summary, accuracy,
                                                 start_options, puller))
        client_app = server_app.with_name("client_app.py")
        stamps = Path(folder) / "stamps.jsonl"
        client_app.write_text(client_source(client_app.read_text(), stamps))
        declare_device_keys(app / "pyproject.toml", profile, seconds, seed)
        if FOLDER.get(example, example) == "advanced-pytorch":
            overrides += f" save-dir='{Path(folder) / 'saved'}'"
        runner = _run_simulation if mode == "simulation" else _run_loopback
        started, cpu_before = time.perf_counter(), host_cpu_seconds()
        # jobs out at once: FedAvg's cohort per round; asyncfl's concurrency (fraction_train of the nodes)
        code, output = runner(app, nodes, overrides, folder, timeout=3600, actors=cohort,
                              runtime_workers=runtime_workers)
        wall, cpu_after = time.perf_counter() - started, host_cpu_seconds()
        if code != 0 or not timeline.exists():
            raise SystemExit(f"{example} / {strategy} / {mode} run {run} failed (rc {code}):\n{output[-4000:]}")
        points = [json.loads(line) for line in timeline.read_text().splitlines()]
        facts = json.loads(summary.read_text()) if summary.exists() else {}
        jobs = read_stamps(stamps)
    updates = rounds * cohort
    at_equal_work = [p for p in points if p["round"] == rounds]
    if not at_equal_work:
        raise SystemExit(f"{example} / {strategy} / {mode} run {run} has no evaluation of round {rounds}: {points[-3:]}")
    equal = at_equal_work[-1]
    last = equal["t"]
    # the steady rate: from the first round's evaluation on (Ray's actors or the SuperNodes' first ClientApp
    # processes start before it: imports, data), rounds of `cohort` updates each
    first = next((p for p in points if p["round"] >= 1), None)
    if first is None:
        raise SystemExit(f"{example} / {strategy} / {mode} run {run} evaluated no round: {points}")
    kept = ("arrivals", "rejected-updates", "rejected-by-reason", "staleness-mean", "client-train-s-mean",
            "job-round-trip-s-mean", "in-flight-cap-mean", "held-dispatches", "reply-pulls", "reply-miss-gap-s-mean",
            "server-ms-per-arrival", "stop-reason")
    return {"example": example, "strategy": strategy, "run": run, "mode": mode, "profile": profile,
            **({"start-options": start_options} if start_options else {}),
            **({f"puller-{name}": value for name, value in puller_settings(puller).items()}
               if strategy != "flower-fedavg" else {}),
            "device-seconds": seconds, "device-seed": seed, "rounds": rounds, "run-rounds": run_rounds,
            "updates": updates,
            **ideal(profile, nodes, seconds, seed, in_flight=cohort),
            **({"runtime-workers": runtime_workers or min(32, (os.cpu_count() or 1) + 4), "ray-actors": cohort}
               if mode == "simulation" else {}),
            **({"runtime-widened": True} if runtime_workers else {}),
            "timeline": [[p["round"], p["t"], round(p["accuracy"], 4)] for p in points],
            "final": round(equal["accuracy"], 4), "train-seconds": last, "process-seconds": round(wall, 1),
            "last-accuracy": round(points[-1]["accuracy"], 4), "updates-per-s": updates / last,
            "first-round-s": first["t"],
            **({"host-cpu-seconds": round(cpu_after - cpu_before, 1), "host-cores": os.cpu_count()}
               if cpu_before is not None and cpu_after is not None else {}),
            # the host's CPU over the span the steady rate is measured on (first round's evaluation to equal work's)
            **({"host-cpu-steady-seconds": round(equal["cpu"] - first["cpu"], 1)}
               if equal.get("cpu") is not None and first.get("cpu") is not None else {}),
            "steady-updates-per-s": (equal["round"] - first["round"]) * cohort / max(last - first["t"], 1e-9),
            # the server-side evaluations' own seconds (the engine's loop waits for each one)
            **({"evaluation-s-mean": round(sum(p["evaluation_s"] for p in points) / len(points), 3)}
               if all("evaluation_s" in p for p in points) else {}),
            **({"job-stamps": compact_stamps(jobs)} if jobs else {}),
            **{key: facts[key] for key in kept if key in facts}}


def read_stamps(path: Path) -> list[dict]:
    """The ``_stamped`` mod's lines; a line cut off (a loopback ClientApp still writing as the run ends) is left out."""
    stamps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            stamps.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return stamps


def compact_stamps(stamps: list[dict]) -> list[list]:
    """The ``_stamped`` mod's lines as a cell keeps them: ``[created, began, ended, device, node]`` per line, seconds
    since the first request was made (ms), ``ended`` and ``device`` None on a line written as the ClientApp started
    (cells stamped before the node was: four fields)."""
    t0 = min(stamp["created"] for stamp in stamps)
    return [[round(stamp["created"] - t0, 3), round(stamp["began"] - t0, 3),
             None if "ended" not in stamp else round(stamp["ended"] - t0, 3), stamp.get("device"), stamp.get("node")]
            for stamp in stamps]


def job_split(stamps: list[list], synchronous: bool) -> dict:
    """Means over a run's train jobs from its stamps (:func:`compact_stamps`; the node, where stamped, is not used).

    - ``delivery``: from the ServerApp making a request to its ClientApp starting (Flower's push, the SuperLink,
      its runtime's look for new messages every 0.1 s, a free worker, Ray's actor call), over the jobs requested
      once a first ClientApp was done (the first wave waits for Ray's actors to start: apart);
    - ``clientapp``: the ClientApp's time with a job, and ``device``: the time its reply reports (``train-seconds``:
      the handler and the device mod's wait, so the two differ only by the outer mods' own bookkeeping);
    - ``next-request``: from a ClientApp's end to the request that replaced it: the reply's way back (Ray, the
      SuperLink), the puller's notice, the server's step and evaluations, a held slot's wait (FedBuff). Asynchronous:
      each request after the first wave takes the oldest end before it not yet taken (one to one, in order);
      ``synchronous`` (Flower's FedAvg): a round's last end to the next round's first request, for rounds whose
      every job left an end."""
    created = sorted(stamp[0] for stamp in stamps if stamp[2] is None)  # each request that reached a ClientApp
    done = [stamp for stamp in stamps if stamp[2] is not None]
    jobs = [tuple(stamp[:4]) for stamp in done]
    if not jobs:
        return {}
    nodes = [stamp[4] if len(stamp) > 4 else None for stamp in done]
    first_end = min(ended for _, _, ended, _ in jobs)
    steady = [job for job in jobs if job[0] >= first_end]
    first_wave = [began - made for made, began, _, _ in jobs if made < first_end]
    devices = [device for *_, device in steady if device is not None]
    if synchronous:  # a round's requests are made in one push: a new round where they are over a second apart
        firsts = created[:1] + [b for a, b in zip(created, created[1:]) if b - a > 1.0]  # each round's first request
        turnarounds = []
        for first, following in zip(firsts, firsts[1:]):
            requested = [made for made in created if first <= made < following]
            ends = [ended for made, _, ended, _ in jobs if first <= made < following]
            if ends and len(ends) == len(requested):
                turnarounds.append(following - max(ends))
    else:
        by_end, turnarounds, taken = sorted(range(len(jobs)), key=lambda k: jobs[k][2]), [], 0
        first_of_node, seen = set(), set()  # each node's first job, by request (where the stamps have the node)
        for k in sorted(range(len(jobs)), key=lambda k: jobs[k][0]):
            if nodes[k] is not None and nodes[k] not in seen:
                seen.add(nodes[k])
                first_of_node.add(k)
        after_first, after_later = [], []
        for made in created:
            if made >= first_end and taken < len(by_end) and jobs[by_end[taken]][2] <= made:
                k = by_end[taken]
                turnarounds.append(made - jobs[k][2])
                if nodes[k] is not None:
                    (after_first if k in first_of_node else after_later).append(made - jobs[k][2])
                taken += 1
    return {"jobs": len(jobs), "jobs-after-the-first-wave": len(steady),
            **({"first-wave-delivery-s-mean": statistics.mean(first_wave)} if first_wave else {}),
            **({"delivery-s-mean": statistics.mean(began - made for made, began, _, _ in steady),
                "clientapp-s-mean": statistics.mean(ended - began for _, began, ended, _ in steady)} if steady else {}),
            **({"clientapp-device-s-mean": statistics.mean(devices)} if devices else {}),
            **({"next-request-s-mean": statistics.mean(turnarounds)} if turnarounds else {}),
            # asynchronous, nodes stamped: after a node's first job (its reply time not yet learned) and later ones
            **({"next-request-after-first-s-mean": statistics.mean(after_first),
                "next-request-after-later-s-mean": statistics.mean(after_later)}
               if not synchronous and after_first and after_later else {})}


def _cohort(example: str, nodes: int) -> int:
    """Client updates per round: the example's fraction-train (the study's run-config override, else its pyproject;
    Flower's 1.0 where it sets none) of its nodes, at least 2 (Flower's FedAvg samples that many)."""
    import tomllib

    override = re.search(r"(?:^| )fraction-train=([0-9.]+)", EXAMPLES[example][2])
    pyproject = ROOT / "examples" / FOLDER.get(example, example) / "pyproject.toml"
    fraction = float(override.group(1)) if override else \
        tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"].get("fraction-train", 1.0)
    return max(int(fraction * nodes), 2)


def time_to(timeline: list[list[float]], target: float) -> float | None:
    """Seconds until the first evaluation at or above ``target``; None if never."""
    return next((t for _, t, accuracy in timeline if accuracy >= target), None)


def _ideal_rates(cell: dict, cohort: int) -> tuple[float, float]:
    """(the ideal updates/s of the emulated fleet, the bound of the runtime the cell ran in) for ``cell``'s
    strategy: asynchronous, ``cohort`` jobs always out; Flower's FedAvg, a cohort per round, a round lasting
    its cohort's slowest node's time (ideal) or its jobs' time on the runtime's workers (bound), in expectation
    over random cohorts where the cohort is not every node."""
    # (cells written before the field was: simulation on this study's 2-core host)
    workers = cell.get("runtime-workers") or (6 if cell["mode"] == "simulation" else len(cell["fleet"]))
    if cell["strategy"] == "flower-fedavg":
        round_s, bound_s = sampled_rounds(cell["fleet"], cell["device-seconds"], cohort, workers)
        fleet, bound = cohort / round_s, cohort / bound_s
    else:  # asyncfl keeps fraction_train of the nodes' jobs out (the cohort)
        fleet, bound = cell["ideal-updates-per-s"], runtime_bound(cell["fleet"], cell["device-seconds"], workers,
                                                                 in_flight=cohort)
    per_update = host_cpu_per_update(cell, cohort)
    if cell["mode"] == "loopback" and per_update:  # the host's cores run every process of the deployment
        bound = min(bound, cell["host-cores"] / per_update)
    return fleet, bound


def _rate_shares(cells: list[dict], cohort: int) -> tuple[list[float], list[float]]:
    """Each cell's updates per second after the first round as a share of the fleet's ideal and of the bound of the
    runtime it ran in (a loopback cell's: its own host CPU's, where lower)."""
    ideals = [_ideal_rates(r, cohort) for r in cells]
    return ([r["steady-updates-per-s"] / fleet for r, (fleet, _) in zip(cells, ideals)],
            [r["steady-updates-per-s"] / bound for r, (_, bound) in zip(cells, ideals)])


def host_cpu_per_update(cell: dict, cohort: int) -> float | None:
    """The host's CPU seconds per client update over the span ``cell``'s steady rate is measured on (its first
    round's evaluation to its equal-work one), None for cells that did not record the host's CPU then."""
    if "host-cpu-steady-seconds" not in cell:
        return None
    first_round = next(r for r, t, _ in cell["timeline"] if t == cell["first-round-s"])
    return cell["host-cpu-steady-seconds"] / ((cell["rounds"] - first_round) * cohort)


def table(rows: list[dict]) -> str:
    """Per example, mode and strategy: final accuracy, wall time to Flower's FedAvg's mean final accuracy (and its
    share of FedAvg's mean time, for the mean and the slowest run), updates per second after the first round
    against the fleet's ideal and the runtime's bound, rejected replies."""
    lines = ["| example | mode | strategy | runs | final (mean; worst) | − FedAvg | s to FedAvg's final (mean; slowest) "
             "| share of FedAvg's s (mean; slowest) | s to equal work (first round) | updates/s after the first round "
             "| share of the ideal | share of the runtime's bound | host CPU-s per update | rejected replies |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for example in EXAMPLES:
        for mode in MODES:
            fedavg = [r for r in rows if (r["example"], r["mode"], r["strategy"]) == (example, mode, "flower-fedavg")]
            if not fedavg:
                continue
            target = statistics.mean(r["final"] for r in fedavg)
            fedavg_s = statistics.mean(r["train-seconds"] for r in fedavg)
            for strategy in STRATEGIES:
                cells = [r for r in rows if (r["example"], r["mode"], r["strategy"]) == (example, mode, strategy)]
                if not cells:
                    continue
                finals = [r["final"] for r in cells]
                # FedAvg's own runs: their whole time (the target is their mean final accuracy)
                reach = [r["train-seconds"] if strategy == "flower-fedavg" else time_to(r["timeline"], target)
                         for r in cells]
                reached = [t for t in reach if t is not None]
                if reached:
                    slowest = "never" if len(reached) < len(reach) else f"{max(reached):.0f}"
                    slowest_share = "never" if len(reached) < len(reach) else f"{max(reached) / fedavg_s:.2f}"
                    reach_text = f"{statistics.mean(reached):.0f}; {slowest}"
                    share = f"{statistics.mean(reached) / fedavg_s:.2f}; {slowest_share}"
                else:
                    reach_text = share = "never"
                rate = statistics.mean(r["steady-updates-per-s"] for r in cells)
                cohort = _cohort(example, len(cells[0]["fleet"]))
                fleet_shares, bound_shares = _rate_shares(cells, cohort)
                of_fleet, of_bound = statistics.mean(fleet_shares), statistics.mean(bound_shares)
                cpu = [c for c in (host_cpu_per_update(r, cohort) for r in cells) if c]
                cpu_text = f"{statistics.mean(cpu):.1f}" if cpu else "–"
                rejected = sum(r.get("rejected-updates", 0) for r in cells)
                lines.append(
                    f"| {example} | {mode} | {strategy} | {len(cells)} | {statistics.mean(finals):.3f}; "
                    f"{min(finals):.3f} | {statistics.mean(finals) - target:+.3f} | {reach_text} | {share} "
                    f"| {statistics.mean(r['train-seconds'] for r in cells):.0f} "
                    f"({statistics.mean(r['first-round-s'] for r in cells):.0f}) | {rate:.2f} | {of_fleet:.2f} "
                    f"| {of_bound:.2f} | {cpu_text} | {rejected if strategy != 'flower-fedavg' else '–'} |")
    return "\n".join(lines)


def overhead_table(folders: dict[str, list[dict]]) -> str:
    """Per folder of cells and asyncfl strategy: where a job's time goes besides its device time. The rate and its
    share of the ideal move with which nodes a run drew; a job's device time over its round trip does not."""
    lines = ["| cells | strategy | runs | updates a run | final at equal work (mean) | updates/s after the first round "
             "(mean) | share of the ideal | device time / round trip (mean; runs) | round trip − device time, s "
             "| last miss to find, s | pulls per update | in-flight cap where it acted (mean; runs it acted in) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for folder, rows in folders.items():
        for strategy in STRATEGIES[1:]:
            cells = [r for r in rows if r["strategy"] == strategy and "job-round-trip-s-mean" in r]
            if not cells:
                continue
            shares = [r["client-train-s-mean"] / r["job-round-trip-s-mean"] for r in cells]
            gaps = [r["reply-miss-gap-s-mean"] for r in cells if "reply-miss-gap-s-mean" in r]
            caps = [r["in-flight-cap-mean"] for r in cells if r.get("in-flight-cap-mean") is not None]
            lines.append(
                f"| {folder} | {strategy} | {len(cells)} | {'/'.join(sorted({str(r['arrivals']) for r in cells}))} "
                f"| {statistics.mean(r['final'] for r in cells):.3f} "
                f"| {statistics.mean(r['steady-updates-per-s'] for r in cells):.3f} "
                f"| {statistics.mean(r['steady-updates-per-s'] / r['ideal-updates-per-s'] for r in cells):.2f} "
                f"| {statistics.mean(shares):.3f}; {min(shares):.3f}-{max(shares):.3f} "
                f"| {statistics.mean(r['job-round-trip-s-mean'] - r['client-train-s-mean'] for r in cells):.2f} "
                f"| {f'{statistics.mean(gaps):.2f}' if gaps else '–'} "
                f"| {statistics.mean(r['reply-pulls'] / r['arrivals'] for r in cells):.1f} "
                f"| {f'{statistics.mean(caps):.2f}' if caps else '–'}; {len(caps)} of {len(cells)} |")
    return "\n".join(lines)


def split_table(folders: dict[str, list[dict]]) -> str:
    """Per folder of cells and strategy, a train job's time from the ``_stamped`` mod's clocks (:func:`job_split`;
    cells without stamps left out): the request's way to the ClientApp (the first wave's, while Ray's actors start,
    apart), the ClientApp's time, the time from its end to the request that replaced it, and for an asynchronous
    strategy a slot's seconds per job beyond the device time (way out, ClientApp beyond the device time, way to the
    next request); with the server's own figures beside (a server-side evaluation's seconds, its step per arrival).
    Every job a ClientApp finished counts, also those the server no longer took in after its stop. In a cell with
    more jobs out than Flower's runtime has workers (``ray-actors`` > ``runtime-workers``) the way out includes the
    wait for a worker: marked, and no slot figure."""
    lines = ["| cells | strategy | runs | jobs a run | ClientApp's time (its device time), s "
             "| first wave: ServerApp to ClientApp, s | then: ServerApp to ClientApp, s "
             "| ClientApp's end to the next request, s | a slot's seconds per job beyond the device time "
             "| a server-side evaluation, s | server ms per arrival |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def mean(values: list[float], digits: int = 3) -> str:
        return f"{statistics.mean(values):.{digits}f}" if values else "–"

    def of(cells: list[dict], key: str) -> list[float]:
        return [r[key] for r in cells if r.get(key) is not None]

    for folder, rows in folders.items():
        for strategy in STRATEGIES:
            cells = [r for r in rows if r["strategy"] == strategy and "job-stamps" in r]
            if not cells:
                continue
            splits = [job_split(r["job-stamps"], synchronous=strategy == "flower-fedavg") | r for r in cells]
            queued = any(r.get("ray-actors", 0) > r.get("runtime-workers", math.inf) for r in cells)
            slots = [] if strategy == "flower-fedavg" or queued else [
                r["delivery-s-mean"] + r["clientapp-s-mean"] - r["clientapp-device-s-mean"] + r["next-request-s-mean"]
                for r in splits if "clientapp-device-s-mean" in r and "next-request-s-mean" in r]
            device = mean(of(splits, 'clientapp-device-s-mean'), 2)
            first, later = of(splits, 'next-request-after-first-s-mean'), of(splits, 'next-request-after-later-s-mean')
            by_node = f" (after a node's first job {mean(first)}, later {mean(later)})" if first and later else ""
            lines.append(f"| {folder} | {strategy} | {len(cells)} | {mean(of(splits, 'jobs'), 0)} "
                         f"| {mean(of(splits, 'clientapp-s-mean'), 2)} ({device}) "
                         f"| {mean(of(splits, 'first-wave-delivery-s-mean'), 1)} "
                         f"| {mean(of(splits, 'delivery-s-mean'))}{' (queued for a worker)' if queued else ''} "
                         f"| {mean(of(splits, 'next-request-s-mean'))}{by_node} | {mean(slots)} "
                         f"| {mean(of(splits, 'evaluation-s-mean'))} "
                         f"| {mean(of(splits, 'server-ms-per-arrival'), 1)} |")
    return "\n".join(lines)


def movement_table(folders: dict[str, list[dict]]) -> str:
    """Per folder of cells and strategy, how far the server-side accuracy moves from one round's evaluation to the
    next (a round's last, where it has several) in the second half of equal work (the mean absolute change, each
    run's mean, then their mean and range): how much one evaluation, such as the final one, can differ from its
    neighbours."""
    lines = ["| cells | strategy | runs | accuracy's move between evaluations, second half of equal work (mean; runs) |",
             "|---|---|---|---|"]
    for folder, rows in folders.items():
        for strategy in STRATEGIES:
            moves = []
            for cell in (r for r in rows if r["strategy"] == strategy):
                by_round = {round_: accuracy for round_, _, accuracy in cell["timeline"]}  # a round's last evaluation
                points = [by_round[round_] for round_ in sorted(by_round)
                          if cell["rounds"] / 2 <= round_ <= cell["rounds"]]
                if len(points) > 1:
                    moves.append(statistics.mean(abs(b - a) for a, b in zip(points, points[1:])))
            if moves:
                lines.append(f"| {folder} | {strategy} | {len(moves)} | {statistics.mean(moves):.3f}; "
                             f"{min(moves):.3f}-{max(moves):.3f} |")
    return "\n".join(lines)


def fedavg_table(folders: dict[str, list[dict]]) -> str:
    """Per folder of cells and asyncfl strategy, against Flower's FedAvg's runs pooled over every folder given (one
    example and setting): final accuracy at equal work (mean; worst) and its distance to FedAvg's mean final, and the
    seconds until FedAvg's mean final is first reached (mean; slowest) as a share of FedAvg's mean time. For
    comparing settings run in separate folders (``--start-options``) with one reference."""
    rows = [r for cells in folders.values() for r in cells]
    fedavg = [r for r in rows if r["strategy"] == "flower-fedavg"]
    setting = ("example", "mode", "rounds", "profile", "device-seconds", "device-seed")
    if not fedavg or len({tuple(r.get(key) for key in setting) for r in rows}) > 1:
        raise SystemExit(f"--fedavg-table needs Flower's FedAvg runs, and every folder of one {', '.join(setting)}")
    target = statistics.mean(r["final"] for r in fedavg)
    fedavg_s = statistics.mean(r["train-seconds"] for r in fedavg)
    lines = ["| cells | strategy | run options | runs | final (mean; worst) | − FedAvg (mean; worst) "
             "| s to FedAvg's final (mean of the runs that reach it; slowest) | share of FedAvg's s (mean; slowest) |",
             "|---|---|---|---|---|---|---|---|"]
    slowest_fedavg = max(r["train-seconds"] for r in fedavg)
    lines.append(f"| {' + '.join(f for f, cells in folders.items() if any(r in fedavg for r in cells))} | flower-fedavg "
                 f"| – | {len(fedavg)} | {target:.3f}; {min(r['final'] for r in fedavg):.3f} | – "
                 f"| {fedavg_s:.0f}; {slowest_fedavg:.0f} | 1.00; {slowest_fedavg / fedavg_s:.2f} |")
    for folder, cells in folders.items():
        for strategy in STRATEGIES[1:]:
            runs = [r for r in cells if r["strategy"] == strategy]
            if not runs:
                continue
            finals = [r["final"] for r in runs]
            reach = [time_to(r["timeline"], target) for r in runs]
            reached = [t for t in reach if t is not None]
            slowest = max(reached) if len(reached) == len(reach) else None
            seconds = "never" if not reached else f"{statistics.mean(reached):.0f}; " + (
                "never" if slowest is None else f"{slowest:.0f}")
            share = "never" if not reached else f"{statistics.mean(reached) / fedavg_s:.2f}; " + (
                "never" if slowest is None else f"{slowest / fedavg_s:.2f}")
            lines.append(f"| {folder} | {strategy} | {runs[0].get('start-options', '') or '–'} | {len(runs)} "
                         f"| {statistics.mean(finals):.3f}; {min(finals):.3f} "
                         f"| {statistics.mean(finals) - target:+.3f}; {min(finals) - target:+.3f} | {seconds} | {share} |")
    return "\n".join(lines)


#: issue 59's done-when: at equal client work within a point of Flower's FedAvg's mean final accuracy (mean and worst
#: run), that accuracy reached in at most half of FedAvg's mean wall time (mean and slowest run), at least 0.9 of the
#: emulated fleet's ideal update rate (mean)
WITHIN_POINTS, TIME_SHARE, RATE_SHARE = 1.0, 0.5, 0.9
#: (app and mode, the folders of Flower's FedAvg's runs, the folders of asyncfl's runs): each one example and setting
STATUS = (
    ("quickstart, simulation", (".", "equal-stop", "quickstart-fedavg", "quickstart-fedavg-2"),
     (".", "equal-stop", "fedbuff-no-hold", "quickstart-tail3", "quickstart-tail3-no-hold", "clientwindow-check",
      "clientwindow-check-before")),
    ("quickstart, simulation, Flower's runtime at 8 threads", ("quickstart-wide-runtime",),
     ("quickstart-wide-runtime", "quickstart-wide-runtime-no-hold")),
    ("advanced, 12 jobs out, simulation", ("advanced",), ("advanced",)),
    ("advanced, 6 jobs out, simulation", ("advanced-6-out", "advanced-6-out-learned", "advanced-6-out-fedavg"),
     ("advanced-6-out", "advanced-6-out-learned", "puller-fine-0", "advanced-6-out-no-hold", "advanced-6-out-refill-first",
      "advanced-6-out-tail3", "advanced-6-out-tail3-no-hold")),
    ("quickstart, loopback", ("loopback", "loopback-fedavg"), ("loopback", "loopback-tail3")),
    ("advanced, 6 jobs out, loopback", ("advanced-loopback-fedavg",), ("advanced-loopback-tail3",)),
)


def welch_half_width(a: list[float], b: list[float]) -> float | None:
    """Half the width of the 95 % interval of ``mean(a) - mean(b)`` (Welch's t, unequal variances); None with fewer
    than 2 values on a side or none spread."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return None
    from scipy.stats import t

    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return float(t.ppf(0.975, df)) * math.sqrt(va + vb)


def _points_from(cells: list[dict], target: float) -> list[float]:
    """Each cell's final accuracy minus ``target``, in points, rounded where float noise would cross a boundary
    (0.80 - 0.81 is -1 point, not -1.0000000000000009)."""
    return [round(100 * (r["final"] - target), 9) + 0.0 for r in cells]


def status_table(here: Path = HERE, status: tuple = STATUS) -> str:
    """Issue 59's targets against every stored run: per app and mode, asyncfl strategy and run options (pooled over
    the folders of :data:`STATUS`, whatever the puller), the distance to Flower's FedAvg's mean final at equal work,
    the time to reach it as a share of FedAvg's mean time, the rate as a share of the fleet's ideal (and of the
    runtime's or host's bound), replies rejected or lost, and which targets hold (:data:`WITHIN_POINTS`, :data:`TIME_SHARE`,
    :data:`RATE_SHARE`)."""
    lines = ["| app, mode | strategy | run options | runs (FedAvg's) | − FedAvg, points (mean ± 95 % interval; worst) "
             "| share of FedAvg's time (mean; slowest) | share of the ideal rate (mean; lowest) "
             "| share of the runtime's or host's bound (mean) | replies rejected or lost | accuracy, time, rate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, fedavg_folders, asyncfl_folders in status:
        fedavg = [r for f in fedavg_folders for r in load(here / f / "cells.jsonl") if r["strategy"] == "flower-fedavg"]
        target = statistics.mean(r["final"] for r in fedavg)
        fedavg_s = statistics.mean(r["train-seconds"] for r in fedavg)
        fedavg_points = _points_from(fedavg, target)
        runs = [r for f in asyncfl_folders for r in load(here / f / "cells.jsonl") if r["strategy"] != "flower-fedavg"]
        groups: dict[tuple[str, str], list[dict]] = {("flower-fedavg", ""): fedavg}
        for r in runs:
            groups.setdefault((r["strategy"], r.get("start-options", "")), []).append(r)
        for (strategy, options), cells in sorted(groups.items(), key=lambda g: (STRATEGIES.index(g[0][0]), g[0][1])):
            points = _points_from(cells, target)
            reach = [time_to(r["timeline"], target) for r in cells]
            shares = [t / fedavg_s for t in reach if t is not None]
            cohort = _cohort(cells[0]["example"], len(cells[0]["fleet"]))
            of_fleet, bound_shares = _rate_shares(cells, cohort)
            of_bound = statistics.mean(bound_shares)
            slowest = f"{max(shares):.2f}" if len(shares) == len(cells) else "never"
            time_text = f"{statistics.mean(shares):.2f}; {slowest}" if shares else "never"
            met = (min(points) >= -WITHIN_POINTS, len(shares) == len(cells) and max(shares) <= TIME_SHARE,
                   statistics.mean(of_fleet) >= RATE_SHARE)
            marks = ['✓' if m else '✗' for m in met]
            spread = welch_half_width(points, fedavg_points)
            interval = "" if strategy == "flower-fedavg" or spread is None else f" ± {spread:.1f}"
            rejected = sum(r.get("rejected-updates", 0) for r in cells)
            if strategy == "flower-fedavg":  # the yardstick: its own runs against their mean (time: no target)
                strategy, marks[1], rejected = "flower-fedavg (its own runs)", "–", "–"
            lines.append(
                f"| {label} | {strategy} | {options or '–'} | {len(cells)} ({len(fedavg)}) "
                f"| {round(statistics.mean(points), 9) + 0.0:+.1f}{interval}; {min(points):+.1f} | {time_text} "
                f"| {statistics.mean(of_fleet):.2f}; {min(of_fleet):.2f} | {of_bound:.2f} "
                f"| {rejected} | {', '.join(marks)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", default=["quickstart-pytorch"], choices=list(EXAMPLES))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--mode", choices=MODES, default="simulation")
    parser.add_argument("--runs", type=int, default=3, help="runs per cell (the wall clock is not seeded)")
    parser.add_argument("--profile", default="quarter-5x-slower")
    parser.add_argument("--device-seconds", type=float, default=3.0,
                        help="a speed-1 node's seconds per train job (nominal mode)")
    parser.add_argument("--device-seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=20, help="num-server-rounds (FedAvg's rounds; equal updates)")
    parser.add_argument("--async-rounds", type=int, default=None,
                        help="num-server-rounds of the asynchronous strategies (default: --rounds), to see when they "
                             "reach FedAvg's final accuracy; their final accuracy is read at --rounds")
    parser.add_argument("--start-options", default="",
                        help="keywords for an asyncfl strategy's start(), as Python (\"dispatch_hold=0.0\"): an "
                             "ablation, stored in its own --out folder")
    parser.add_argument("--puller-cap", type=float, default=None,
                        help="seconds: the wall-clock puller's longest wait between two pulls of one reply (default: "
                             "asyncfl's); an ablation, stored in its own --out folder")
    parser.add_argument("--puller-fine", type=float, default=None,
                        help="seconds: the puller's spacing at a client's learned time to reply (default: asyncfl's; "
                             "0: learn nothing); an ablation, stored in its own --out folder")
    parser.add_argument("--runtime-workers", type=int, default=None,
                        help="simulation: Flower's runtime runs this many ClientApps at once instead of min(32, cores "
                             "+ 4) (a patch of its thread pool in its own process: a diagnosis of where the rate is "
                             "capped, stored in its own --out folder)")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--table", action="store_true", help="only print the table of the stored cells")
    parser.add_argument("--overhead-table", nargs="+", type=Path, metavar="FOLDER",
                        help="only print where asyncfl's jobs' time goes, per folder of stored cells")
    parser.add_argument("--movement-table", nargs="+", type=Path, metavar="FOLDER",
                        help="only print how far the accuracy moves between evaluations, per folder of cells")
    parser.add_argument("--split-table", nargs="+", type=Path, metavar="FOLDER",
                        help="only print a train job's time split by the stamps of its ClientApp, per folder of cells")
    parser.add_argument("--fedavg-table", nargs="+", type=Path, metavar="FOLDER",
                        help="only print each folder's asyncfl runs against Flower's FedAvg's runs of all of them")
    parser.add_argument("--status-table", action="store_true",
                        help="only print issue 59's targets against every stored run (the folders of STATUS)")
    args = parser.parse_args()
    if args.status_table:
        print(status_table())
        return
    for folders, make in ((args.overhead_table, overhead_table), (args.movement_table, movement_table),
                          (args.split_table, split_table), (args.fedavg_table, fedavg_table)):
        if folders:  # a table of stored cells per folder, nothing run
            print(make({str(folder): load(folder / "cells.jsonl") for folder in folders}))
            return
    DeviceProfile.parse(args.profile)  # a wrong profile fails here, before any run
    if args.puller_cap is not None and not 0.2 <= args.puller_cap <= 60:
        parser.error(f"--puller-cap {args.puller_cap}: valid are 0.2 (the puller's shortest wait) to 60 seconds")
    if args.puller_fine is not None and not (args.puller_fine == 0 or 0.01 <= args.puller_fine <= 1):
        parser.error(f"--puller-fine {args.puller_fine}: valid are 0 (learn nothing) or 0.01 to 1 seconds")
    if args.runtime_workers is not None and (args.mode != "simulation" or not 1 <= args.runtime_workers <= 64):
        parser.error(f"--runtime-workers {args.runtime_workers} --mode {args.mode}: valid in simulation only, 1 to 64")
    puller = {name: value for name, value in (("cap", args.puller_cap), ("fine", args.puller_fine))
              if value is not None}
    path = args.out / "cells.jsonl"
    widened = next((r for r in load(path) if r["mode"] == "simulation"
                    and r.get("runtime-widened", False) != bool(args.runtime_workers)), None)
    if widened is not None and not args.table:
        parser.error(f"{path} holds simulation runs {'with' if widened.get('runtime-widened') else 'without'} "
                     "--runtime-workers; give these runs their own --out")
    settings = puller_settings(puller)
    other = next((stored_puller(r) for r in load(path) if r["strategy"] != "flower-fedavg"
                  and stored_puller(r) != settings), None)
    if other is not None and not args.table:
        parser.error(f"{path} holds asyncfl runs whose puller had {other}; these would have {settings}: "
                     "give them their own --out")
    done = {(r["example"], r["mode"], r["strategy"], r["run"]) for r in load(path)}
    todo = [(e, s, run) for e in args.examples for run in range(1, args.runs + 1) for s in args.strategies
            if (e, args.mode, s, run) not in done]
    if not args.table:
        pin_code()
        args.out.mkdir(parents=True, exist_ok=True)
        for example, strategy, run in todo:
            row = run_cell(example, strategy, run, args.mode, args.profile, args.device_seconds, args.rounds,
                           args.device_seed, args.start_options, args.async_rounds, puller, args.runtime_workers)
            with path.open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(f"{example} {args.mode} {strategy} run {run}: final {row['final']:.3f} in {row['train-seconds']:.0f} s "
                  f"({row['steady-updates-per-s']:.2f} updates/s after the first round); "
                  f"rejected {row.get('rejected-by-reason', {})}", flush=True)
    print(table(load(path)))


if __name__ == "__main__":
    main()
