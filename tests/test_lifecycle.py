"""How a command's run starts and ends (issue 60: items 3, 8, 12, 13).

Whatever ends ``asyncfl`` (SIGHUP from a closed terminal, SIGTERM, Ctrl-C, a normal exit) ends
every process it started, those that ignore SIGTERM and those re-parented away from it included;
a bad ``--ray-address`` is refused before anything starts; the engine stops waiting for nodes
once the connected set is stable; a wall-clock run writes a row only when the model changed.
Processes here are small Python stand-ins, not Flower's.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from asyncfl import FedBuff
from asyncfl.deploy import simulation
from asyncfl.deploy.processes import FlowerProcess, running, signals_held, stop_processes
from asyncfl.server_app import transport
from asyncfl.server_app.discovery import query_identities
from asyncfl.server_app.engine_state import EngineStats
from asyncfl.server_app.recorder import RunRecorder
from asyncfl.server_app.scoring import ModelState, Scoring
from tests.fake_grid import FakeGrid

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for a SuperLink (family.py): a child that ignores SIGTERM (as Ray's agents did), and a grandchild
# whose parent exits at once (re-parented away from us, as a daemon is); each writes its pid to a file once it runs.
SCRIPTS = {
    "family.py": """
import os, subprocess, sys, time
here, out = os.path.dirname(os.path.abspath(__file__)), sys.argv[1]
subprocess.Popen([sys.executable, os.path.join(here, "stubborn.py"), out])
subprocess.Popen([sys.executable, os.path.join(here, "spawner.py"), out]).wait()
time.sleep(600)
""",
    "stubborn.py": """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1], "stubborn").write_text(str(os.getpid()))
time.sleep(600)
""",
    "spawner.py": """
import os, subprocess, sys
subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "orphan.py"), sys.argv[1]],
                 start_new_session=True)
""",
    "orphan.py": """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], "orphan").write_text(str(os.getpid()))
time.sleep(600)
""",
}


def _write_family(folder: Path) -> Path:
    for name, text in SCRIPTS.items():
        (folder / name).write_text(text)
    return folder / "family.py"


def _mentioning(folder: Path) -> list[int]:
    """Running processes whose command line names ``folder`` (all the stand-ins do)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(folder).encode() in cmdline.read_bytes() and running(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
        except (OSError, ValueError):
            continue
    return found


def _wait_for_files(folder: Path, names: tuple[str, ...], timeout: float = 30.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while not all((folder / name).exists() and (folder / name).read_text() for name in names):
        assert time.monotonic() < deadline, f"{names} not written within {timeout}s"
        time.sleep(0.05)
    return {name: int((folder / name).read_text()) for name in names}


def _start_family(tmp_path: Path) -> tuple[FlowerProcess, dict[str, int]]:
    script = _write_family(tmp_path)
    process = FlowerProcess([sys.executable, str(script), str(tmp_path)], tmp_path / "family.log", tmp_path,
                            dict(os.environ)).start()
    return process, _wait_for_files(tmp_path, ("stubborn", "orphan"))


# ------------------------------------------------------------------ item 3: teardown
def test_stopping_ends_what_ignores_sigterm_and_what_was_reparented(tmp_path, monkeypatch):
    # Prepare: a process whose child ignores SIGTERM and whose grandchild's parent has exited
    process, pids = _start_family(tmp_path)
    assert os.getppid() != pids["orphan"] and running(pids["orphan"])
    # Execute
    started = time.monotonic()
    stop_processes([process], grace=1.0)
    # Assert: all three gone, within the grace period and a little
    assert not any(running(pid) for pid in (process.pid, *pids.values()))
    assert time.monotonic() - started < 8.0


def test_a_crash_stop_kills_everything_at_once(tmp_path):
    process, pids = _start_family(tmp_path)
    process.stop(signal.SIGKILL)
    assert not any(running(pid) for pid in (process.pid, *pids.values()))


def test_several_processes_stop_within_one_grace_period(tmp_path):
    # Prepare: three processes that each ignore SIGTERM (each stop used to wait its own 20 s)
    ignoring = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); " \
               "time.sleep(600)"
    started = [FlowerProcess([sys.executable, "-c", ignoring], tmp_path / f"p{i}.log", tmp_path,
                             dict(os.environ)).start() for i in range(3)]
    for i in range(3):
        deadline = time.monotonic() + 30
        while "up" not in (tmp_path / f"p{i}.log").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    # Execute
    began = time.monotonic()
    stop_processes(started, grace=1.0)
    # Assert
    assert time.monotonic() - began < 4.0
    assert not any(p.alive() for p in started)


def test_a_signal_during_teardown_waits_until_it_is_done():
    # Prepare: the CLI's handler (a signal ends the command by KeyboardInterrupt)
    from asyncfl.cli import _interrupt

    previous = signal.signal(signal.SIGHUP, _interrupt)
    done = []
    try:
        # Execute / Assert: the SIGHUP is held during the block, then acted on
        with pytest.raises(KeyboardInterrupt):
            with signals_held():
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(0.05)
                done.append("teardown finished")
        assert done == ["teardown finished"]
    finally:
        signal.signal(signal.SIGHUP, previous)


DEPLOY_WITH_STAND_INS = textwrap.dedent("""
    import sys, subprocess
    from pathlib import Path
    import asyncfl.cli as cli
    import asyncfl.deploy.local as local
    import asyncfl.deploy.processes as processes

    processes.STOP_GRACE_S = 1.0  # the stubborn stand-in is killed after this

    family, out = sys.argv[1], sys.argv[2]
    local.superlink_command = lambda *a, **k: [sys.executable, family, out]
    local.supernode_command = lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(600)", out]
    local.wait_for_port = lambda *a, **k: None
    local.LocalDeployment.submit = lambda self, run_config: subprocess.Popen(
        [sys.executable, "-c", "import time; print('run going', flush=True); time.sleep(600)", out],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    sys.exit(cli.main(["deploy", "--app", sys.argv[3], "--supernodes", "2"]))
""")


@pytest.mark.parametrize("signals", [(signal.SIGHUP,), (signal.SIGINT,), (signal.SIGHUP, signal.SIGTERM)])
def test_asyncfl_deploy_ends_everything_it_started_however_it_is_stopped(tmp_path, signals):
    # Prepare: `asyncfl deploy` whose SuperLink is the stand-in family above, SuperNodes sleeping processes
    family = _write_family(tmp_path)
    (tmp_path / "deploy.py").write_text(DEPLOY_WITH_STAND_INS)
    command = subprocess.Popen([sys.executable, str(tmp_path / "deploy.py"), str(family),
                                str(tmp_path), str(ROOT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=tmp_path, start_new_session=True)
    try:
        pids = _wait_for_files(tmp_path, ("stubborn", "orphan"), timeout=60)
        for line in command.stdout:
            if "run going" in line:
                break
        # Execute: the terminal closes (SIGHUP), Ctrl-C, or a timeout's SIGTERM while the teardown runs
        for sig in signals:
            command.send_signal(sig)
            time.sleep(0.2)
        output = command.communicate(timeout=60)[0]
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
    # Assert: one line, exit 130, and nothing it started still runs
    assert command.returncode == 130, output
    assert "asyncfl deploy: interrupted" in output
    assert not any(running(pid) for pid in pids.values())
    assert not _mentioning(tmp_path)


def test_the_cli_ends_on_sighup_as_on_sigterm(monkeypatch):
    # Prepare: a command that only reports which handlers are set
    import asyncfl.cli as cli

    seen = {}
    monkeypatch.setattr(cli, "_compose", lambda args: seen.update(
        {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}) or 0)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    try:
        cli.main(["compose", "--out", os.devnull, "--insecure"])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    # Assert
    assert seen[signal.SIGHUP] is cli._interrupt and seen[signal.SIGTERM] is cli._interrupt


# ------------------------------------------------------------------ item 8: --ray-address
def test_a_ray_address_nobody_answers_at_is_refused_in_one_line_before_anything_starts(monkeypatch, capsys):
    # Prepare: a port nothing listens on; starting a SuperLink would fail the test
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(simulation, "LocalSuperLink", lambda *a, **k: pytest.fail("a SuperLink was started"))
    # Execute
    code = simulation.run_app(ROOT, [], 2, 1, ray_address=f"127.0.0.1:{port}")
    # Assert
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith(f"asyncfl run: --ray-address 127.0.0.1:{port}: nothing answers there")
    assert "HEAD:PORT" in err and "6379" in err


@pytest.mark.parametrize("address", ["head", "head:", "head:port", "head:70000", ":6379"])
def test_a_ray_address_that_is_not_host_port_is_refused(address):
    with pytest.raises(ValueError, match=r"--ray-address .* is not HOST:PORT; expected the HEAD:PORT"):
        simulation.check_ray_address(address)


def test_a_ray_address_with_a_listener_and_rays_own_words_pass():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        host, port = server.getsockname()
        simulation.check_ray_address(f"{host}:{port}")
        simulation.check_ray_address(f"ray://{host}:{port}")
    simulation.check_ray_address("auto")
    simulation.check_ray_address("local")


# ------------------------------------------------------------------ item 13: waiting for nodes
class GrowingGrid:
    """Node ids that appear on a schedule: ``[(seconds after creation, node ids then)]``."""

    def __init__(self, schedule):
        self.schedule, self.started = schedule, time.monotonic()

    def get_node_ids(self):
        elapsed = time.monotonic() - self.started
        return [nodes for at, nodes in self.schedule if at <= elapsed][-1]


def test_the_wait_ends_once_the_nodes_are_stable_not_at_the_deadline():
    grid = GrowingGrid([(0.0, []), (0.3, [1, 2]), (0.6, [1, 2, 3])])
    started = time.monotonic()
    nodes = transport.wait_for_nodes(grid, 8, timeout=60.0, settle=0.5)
    assert nodes == [1, 2, 3]
    assert 1.0 <= time.monotonic() - started < 3.0  # the last join at 0.6 s, then 0.5 s of calm


def test_without_settle_the_wait_runs_to_the_deadline():
    started = time.monotonic()
    assert transport.wait_for_nodes(GrowingGrid([(0.0, [1])]), 2, timeout=0.6) == [1]
    assert time.monotonic() - started >= 0.6


def test_no_node_at_all_is_waited_for_until_the_deadline():
    started = time.monotonic()
    assert transport.wait_for_nodes(GrowingGrid([(0.0, [])]), 2, timeout=0.6, settle=0.1) == []
    assert time.monotonic() - started >= 0.6


def _library_client(node, message):
    state = message.content["arrays"].to_torch_state_dict()
    trained = OrderedDict((k, v + 1) for k, v in state.items())
    return Message(RecordDict({"arrays": ArrayRecord(trained), "metrics": MetricRecord({"num-examples": 10})}),
                   reply_to=message)


def test_library_start_with_more_concurrency_than_nodes_does_not_wait_a_minute(caplog):
    # Prepare: concurrency 8 on a grid of 5 nodes, the library's default wait (min(timeout, 60) s)
    caplog.set_level(logging.INFO)
    initial = ArrayRecord(OrderedDict(w=torch.zeros(3)))
    started = time.monotonic()
    # Execute
    result = FedBuff(buffer_size=2, fraction_evaluate=0.0).start(FakeGrid(5, _library_client), initial,
                                                                  num_rounds=0, max_arrivals=6, concurrency=8)
    # Assert: done in seconds, and the cap said once
    assert time.monotonic() - started < 15.0
    assert result.summary["arrivals"] == 6
    assert caplog.text.count("concurrency 8 capped at 5 job(s) in flight: 5 node(s) x 1 job(s) each") == 1


def test_a_deployment_asks_every_node_its_identity_at_once():
    grid = FakeGrid(4, _library_client)
    found = query_identities(grid, grid.get_node_ids(), 5.0, probe_first=False)
    assert sorted(found.partition_of.values()) == [0, 1, 2, 3]
    assert len(grid.pushed) == 4  # one push each, no second round for the others


def test_a_simulation_asks_one_node_first_and_stops_at_a_refusal():
    grid = FakeGrid(4, _library_client, partition_ids=False)
    found = query_identities(grid, grid.get_node_ids(), 5.0)
    assert found.refused == 1 and len(grid.pushed) == 1


# ------------------------------------------------------------------ item 12: wall-clock rows and progress
def _state(version: int, round_: int = 0) -> ModelState:
    return ModelState(version, round_, np.zeros(1), lambda: None, [0])


def test_wall_clock_rows_only_when_the_model_changed():
    stats = EngineStats()
    scored = []
    scoring = Scoring(2.0, 0, lambda model: scored.append(1) or (1.0, 0.5), stats, changed_only=True)
    scoring.until(0.0, lambda: _state(0))
    scoring.until(90.0, lambda: _state(0))  # 45 points, the same model: no new rows
    scoring.until(95.0, lambda: _state(1))
    assert [(row["time"], row["server_version"]) for row in stats.evaluations] == [(0.0, 0), (92.0, 1)]
    assert len(scored) == 2


def test_virtual_clock_rows_stay_at_every_point():
    stats = EngineStats()
    scoring = Scoring(2.0, 0, lambda model: (1.0, 0.5), stats)
    scoring.until(6.0, lambda: _state(0))
    assert [row["time"] for row in stats.evaluations] == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("clock, says", [("wall", "wall t=12.5s"), ("virtual", "virtual t=12.5")])
def test_the_progress_line_names_its_clock(tmp_path, caplog, clock, says):
    caplog.set_level(logging.INFO, logger="asyncfl.recorder")
    logging.getLogger("asyncfl.recorder").propagate = True
    recorder = RunRecorder(tmp_path, {}, (), True, 10, 0.0, clock=clock)
    recorder.on_progress(12.5, 3)
    assert f"| {says} |" in caplog.text
