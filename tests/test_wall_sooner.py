"""The wall-clock fleet study (benchmarks/wall_sooner): its ideal rates by hand, its app copy, its stored table."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    sys.path.insert(0, str(ROOT / "benchmarks" / "dropin"))  # the study reuses the drop-in study's swap
    try:
        yield load_script("benchmarks/wall_sooner/study.py", "wall_sooner_study")
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "dropin"))


def test_the_runtime_bound_by_hand(study):
    # two nodes, jobs of 1 s and 2 s: in parallel 1 + 1/2 updates/s; one worker alternates them, 2 jobs per 3 s
    assert study.runtime_bound([1.0, 2.0], 1.0, workers=2) == pytest.approx(1.5, rel=1e-3)
    assert study.runtime_bound([1.0, 2.0], 1.0, workers=1) == pytest.approx(2 / 3, rel=1e-3)
    # three 1 s nodes on two workers: the workers never idle, 2 updates/s
    assert study.runtime_bound([1.0, 1.0, 1.0], 1.0, workers=2) == pytest.approx(2.0, rel=1e-3)
    # one job out for two nodes: one at a time, each node in turn
    assert study.runtime_bound([1.0, 3.0], 1.0, workers=2, in_flight=1) == pytest.approx(0.5, rel=1e-3)
    # a synchronous round on 2 workers, jobs in the order given: 3 | 1 + 1 -> 3 s; 1 + 1 + 2 | 2 -> 4 s (the last
    # 2 s job starts when the first worker frees at 2 s; longest first would end at 3 s); 8 jobs on 8: the slowest
    assert study.round_bound([3.0, 1.0, 1.0], 1.0, workers=2) == 3.0
    assert study.round_bound([1.0, 2.0, 1.0, 2.0], 1.0, workers=2) == 4.0
    assert study.round_bound([1.0, 5.0, 1.0], 3.0, workers=8) == 15.0


def test_a_sampled_cohort_s_round_is_its_slowest_node_s_on_average(study):
    # 2 of 3 nodes (slowdowns 1, 1, 4) at random: the slow node is drawn in 2 of the 3 pairs, so a round's ideal
    # time is 4 s in 2/3 of the draws and 1 s in 1/3: 3 s on average; one worker runs a pair's jobs one after the
    # other: (1+4, 1+4, 1+1) -> 4 s on average
    ideal_s, one_worker_s = study.sampled_rounds([1.0, 1.0, 4.0], 1.0, cohort=2, workers=1, draws=6000)
    assert ideal_s == pytest.approx(3.0, rel=0.03)
    assert one_worker_s == pytest.approx(4.0, rel=0.03)
    # every node each round: exact
    assert study.sampled_rounds([1.0, 1.0, 4.0], 1.0, cohort=3, workers=1) == (4.0, 6.0)


def test_a_loopback_cells_bound_is_its_hosts_cpu_when_that_is_below_the_fleets(study):
    # nodes at 1x and 5x of 10 s: the fleet allows 0.1 + 0.02 updates/s; the steady span is rounds 1 to 3, 2 rounds
    # of 2 updates (the run went on to round 5, past equal work: not counted, nor is its whole run's CPU)
    cell = {"strategy": "fedbuff", "mode": "loopback", "fleet": [1.0, 5.0], "device-seconds": 10.0,
            "ideal-updates-per-s": 0.12, "ideal-round-s": 50.0, "rounds": 3, "run-rounds": 5, "host-cores": 2,
            "timeline": [[0, 1.0, 0.1], [1, 30.0, 0.2], [2, 45.0, 0.3], [3, 60.0, 0.4]], "first-round-s": 30.0,
            "host-cpu-seconds": 999.0}
    # 40 CPU-s for 4 updates: 10 per update, 2 cores run 0.2/s, more than the fleet's 0.12: the fleet bounds
    assert study.host_cpu_per_update({**cell, "host-cpu-steady-seconds": 40.0}, 2) == 10.0
    assert study._ideal_rates({**cell, "host-cpu-steady-seconds": 40.0}, 2) == pytest.approx((0.12, 0.12), rel=1e-3)
    # 100 CPU-s: 25 per update, the host runs 0.08/s, below the fleet: the host bounds
    assert study._ideal_rates({**cell, "host-cpu-steady-seconds": 100.0}, 2) == pytest.approx((0.12, 0.08), rel=1e-3)
    # FedAvg's round: its slowest node's 50 s for 2 updates, 0.04/s, under the host's 0.08
    fedavg = {**cell, "strategy": "flower-fedavg", "host-cpu-steady-seconds": 100.0}
    assert study._ideal_rates(fedavg, 2) == pytest.approx((0.04, 0.04), rel=1e-3)
    # a cell without the host's CPU over its steady span (simulation, or written before the field was) keeps the
    # runtime's bound
    assert study.host_cpu_per_update(cell, 2) is None
    assert study._ideal_rates(cell, 2) == pytest.approx((0.12, 0.12), rel=1e-3)


def test_the_hosts_busy_cpu_is_read_from_proc_stat_and_grows_with_work(study):
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat on this host")
    before = study.host_cpu_seconds()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # 0.3 s of this process's own CPU, which the host's busy time includes
        pass
    assert study.host_cpu_seconds() - before >= 0.25


def test_the_ideal_of_a_quarter_5x_slower_fleet_is_its_sum_of_rates(study):
    ideal = study.ideal("quarter-5x-slower", 8, 3.0, 0)
    assert sorted(ideal["fleet"])[-2:] == [5.0, 5.0] and ideal["ideal-round-s"] == 15.0
    assert ideal["ideal-updates-per-s"] == pytest.approx(sum(1 / (3.0 * s) for s in ideal["fleet"]), rel=1e-3)
    assert study.runtime_bound(ideal["fleet"], 3.0, workers=8) == pytest.approx(ideal["ideal-updates-per-s"], rel=1e-2)


def test_the_ideal_with_fewer_jobs_out_than_nodes_is_that_many_jobs_always_running(study):
    # 12 of 50 jobs out, a freed slot going to an idle node: node i cycles through its job (t_i) and an idle wait w
    # that is the same for every node, so it delivers 1 / (t_i + w) updates/s and is busy t_i / (t_i + w) of the
    # time; w is where the busy shares sum to the 12 jobs out (bisection). Slow nodes, busy longer, get fewer jobs:
    # the rate is above 12 / (mean job time).
    ideal = study.ideal("quarter-5x-slower", 50, 6.0, 0, in_flight=12)
    times = [6.0 * s for s in ideal["fleet"]]
    low, high = 0.0, 1e4
    for _ in range(100):
        wait = (low + high) / 2
        low, high = (wait, high) if sum(t / (t + wait) for t in times) > 12 else (low, wait)
    assert ideal["ideal-updates-per-s"] == pytest.approx(sum(1 / (t + wait) for t in times), rel=0.01)
    assert ideal["ideal-updates-per-s"] > 12 / (sum(times) / 50)
    assert ideal["ideal-updates-per-s"] < study.ideal("quarter-5x-slower", 50, 6.0, 0)["ideal-updates-per-s"] / 4


@pytest.mark.parametrize("package", ["quickstart-pytorch/pytorchexample", "advanced-pytorch/advancedexample"])
def test_the_copy_swaps_the_strategy_times_evaluation_and_adds_the_mod(study, tmp_path, package):
    example = ROOT / "examples" / package
    for strategy, imported in (("ca2fl", "CA2FL as FedBuff"), ("fedasync", "FedAsync as FedBuff"),
                               ("flower-fedavg", "FedAvg as FedBuff")):
        server = study.server_source((example / "server_app.py").read_text(), strategy, tmp_path / "t.jsonl",
                                     tmp_path / "s.json", tmp_path / "a.json",
                                     "" if strategy == "flower-fedavg" else "dispatch_hold=0.0")
        compile(server, "server_app.py", "exec")
        assert imported in server and "evaluate_fn=_timed(global_evaluate)" in server
        assert ("dispatch_hold=0.0" in server) == (strategy != "flower-fedavg")
    client = study.client_source((example / "client_app.py").read_text())
    compile(client, "client_app.py", "exec")
    assert "mods=[report_train_seconds, device_speed]" in client
    stamped = study.client_source((example / "client_app.py").read_text(), tmp_path / "stamps.jsonl")
    compile(stamped, "client_app.py", "exec")
    assert "mods=[_stamped, report_train_seconds, device_speed]" in stamped
    assert repr(str(tmp_path / "stamps.jsonl")) in stamped
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text((example.parent / "pyproject.toml").read_text())
    study.declare_device_keys(pyproject, "quarter-5x-slower", 3.0, 0)
    import tomllib

    config = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]
    assert (config["device-profile"], config["device-seconds"], config["device-seed"]) == ("quarter-5x-slower", 3.0, 0)


def test_the_puller_ablations_set_the_puller_when_the_copy_is_imported(study, tmp_path, monkeypatch):
    from asyncfl.server_app.puller import ThreadedPuller

    source = (ROOT / "examples" / "quickstart-pytorch/pytorchexample" / "server_app.py").read_text()
    plain = study.server_source(source, "fedbuff", tmp_path / "t.jsonl", tmp_path / "s.json", tmp_path / "a.json")
    assert "ThreadedPuller" not in plain
    server = study.server_source(source, "fedbuff", tmp_path / "t.jsonl", tmp_path / "s.json", tmp_path / "a.json",
                                 puller={"cap": 2.5, "fine": 0.0})
    tail = server[server.index("from asyncfl.server_app.puller"):]  # the copy's last lines: run them alone
    monkeypatch.setattr(ThreadedPuller, "MAX_INTERVAL", 1.0)
    monkeypatch.setattr(ThreadedPuller, "FINE", 0.05)
    exec(compile(tail, "server_app.py", "exec"), {})
    assert (ThreadedPuller.MAX_INTERVAL, ThreadedPuller.FINE) == (2.5, 0.0)
    assert ThreadedPuller(object(), workers=0).fine == 0.0


def test_a_study_pins_its_runs_to_its_own_tree(study, monkeypatch):
    import os

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", str(study.ROOT)]))
    study.pin_code()
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(study.ROOT), "/elsewhere"]


def test_the_jobs_out_come_from_the_studys_fraction_train_else_the_examples_pyproject(study):
    assert study._cohort("quickstart-pytorch", 8) == 8  # its pyproject sets none: Flower's 1.0
    assert study._cohort("advanced-pytorch", 50) == 12  # its pyproject's 0.25
    assert study._cohort("advanced-pytorch-6-out", 50) == 6  # the study's override, 0.12


def test_time_to_a_target_is_the_first_evaluation_at_or_above_it(study):
    timeline = [[0, 1.0, 0.1], [1, 5.0, 0.7], [2, 9.0, 0.69], [3, 12.0, 0.8]]
    assert study.time_to(timeline, 0.7) == 5.0 and study.time_to(timeline, 0.75) == 12.0
    assert study.time_to(timeline, 0.9) is None


def test_the_readme_tables_are_the_ones_the_stored_runs_give(study):
    readme = (ROOT / "benchmarks" / "wall_sooner" / "README.md").read_text()
    tables = re.findall(r"<!-- table from (\S+) -->\n(.*?)\n<!-- /table -->", readme, re.S)
    assert len(tables) == 6
    for cells, stored in tables:
        assert stored == study.table(study.load(ROOT / "benchmarks" / "wall_sooner" / cells)), cells
    here = ROOT / "benchmarks" / "wall_sooner"
    by_folder = re.findall(r"<!-- (overhead|split|movement|fedavg) table from ([^>]+?) -->\n(.*?)\n<!-- /table -->",
                           readme, re.S)
    assert sorted({kind for kind, _, _ in by_folder}) == ["fedavg", "movement", "overhead", "split"]
    for kind, folders, stored in by_folder:
        make = {"overhead": study.overhead_table, "split": study.split_table, "movement": study.movement_table,
                "fedavg": study.fedavg_table}[kind]
        assert stored == make({f: study.load(here / f / "cells.jsonl") for f in folders.split()}), (kind, folders)
    status = re.findall(r"<!-- status table -->\n(.*?)\n<!-- /table -->", readme, re.S)
    assert status == [study.status_table(here)]
    listed = {f for _, fedavg, asyncfl in study.STATUS for f in fedavg + asyncfl}
    stored = {str(cells.parent.relative_to(here)) for cells in here.rglob("cells.jsonl")}
    assert stored == listed  # the status table reads every stored run


def test_the_least_device_time_keeps_the_fleets_process_starts_within_the_hosts_share():
    cost = load_script("benchmarks/wall_sooner/clientapp_cost.py", "clientapp_cost")
    # nodes at 1x and 5x: 1.2 jobs per device-second; 4 CPU-s per process start on half of 2 cores -> 4.8 s
    assert cost.least_device_seconds([1.0, 5.0], 4.0, cores=2, host_share=0.5) == 4.8
    d = cost.least_device_seconds([1.1, 5.0, 0.9], 4.5, cores=2, host_share=0.5)
    assert abs(sum(1 / (s * d) for s in (1.1, 5.0, 0.9)) * 4.5 - 1.0) < 1e-9  # one core's worth of process starts


def test_each_asyncfl_cell_records_its_puller_and_a_folder_of_another_puller_is_refused(study, tmp_path, monkeypatch,
                                                                                     capsys):
    import json
    import sys

    import pytest

    assert study.puller_settings() == {"cap": 1.0, "fine": 0.05}  # this tree's defaults
    assert study.puller_settings({"fine": 0}) == {"cap": 1.0, "fine": 0.0}
    assert study.stored_puller({"strategy": "fedbuff"}) == {"cap": 1.0, "fine": 0.0}  # a cell from before the change
    (tmp_path / "cells.jsonl").write_text(json.dumps({"example": "quickstart-pytorch", "mode": "simulation",
                                                      "strategy": "fedbuff", "run": 1}) + "\n")
    monkeypatch.setattr(sys, "argv", ["study.py", "--strategies", "fedbuff", "--runs", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:  # the default puller now learns: refused before any run starts
        study.main()
    assert stop.value.code == 2 and "give them their own --out" in capsys.readouterr().err
    monkeypatch.setattr(study, "run_cell", lambda *a, **k: pytest.fail("run 1 is stored: nothing to run"))
    monkeypatch.setattr(sys, "argv", ["study.py", "--strategies", "fedbuff", "--runs", "1", "--puller-fine", "0",
                                      "--out", str(tmp_path)])
    monkeypatch.setattr(study, "table", lambda rows: "table")
    monkeypatch.setenv("PYTHONPATH", "")  # main() pins the code: restored after the test
    study.main()  # the stored run's puller: accepted, and nothing left to run


def test_the_puller_replay_shows_learned_reply_times_noticed_sooner_for_about_as_many_pulls():
    """The replay is the real puller on a fake clock: the same figures on any machine."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("puller_notice", ROOT / "benchmarks/wall_sooner/puller_notice.py")
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    age_rule = replay.replay(fine=0.0, horizon=400.0)
    learned = replay.replay(horizon=400.0)
    assert age_rule["replies"] > 150 and learned["replies"] >= age_rule["replies"]
    assert learned["notice-s-mean"] < 0.6 * age_rule["notice-s-mean"]  # most nodes have had a job or two by 400 s
    assert learned["pulls-per-reply"] < age_rule["pulls-per-reply"] + 3
    assert age_rule["rate-share"] < learned["rate-share"] < 1.0
    assert replay.replay(fine=0.0, horizon=400.0) == age_rule  # no randomness the seed does not fix


def test_the_timed_evaluation_records_its_own_seconds(study, tmp_path):
    import json

    path = tmp_path / "timeline.jsonl"
    scope: dict = {}
    exec(study.TIMED.format(path=str(path)), scope)
    timed = scope["_timed"](lambda server_round, arrays: {"accuracy": 0.5})
    assert timed(3, None) == {"accuracy": 0.5}
    point = json.loads(path.read_text())
    assert point["round"] == 3 and point["accuracy"] == 0.5 and 0 <= point["evaluation_s"] <= point["t"]


def test_the_stamped_mod_times_a_train_job_from_its_request_s_making_and_the_split_table_reads_it(study, tmp_path):
    import json
    import time

    from flwr.app import Message, MetricRecord, RecordDict

    path = tmp_path / "stamps.jsonl"
    scope: dict = {}
    exec(study.STAMPED.format(path=str(path)), scope)
    request = Message(RecordDict(), dst_node_id=3, message_type="train")
    time.sleep(0.05)  # the request waits before the ClientApp gets it

    def app(msg, context):
        time.sleep(0.05)
        return Message(RecordDict({"metrics": MetricRecord({"train-seconds": 0.04, "train_loss": 1.0})}), reply_to=msg)

    reply = scope["_stamped"](request, None, app)
    assert reply.content.metric_records["metrics"]["train-seconds"] == 0.04
    scope["_stamped"](Message(RecordDict(), dst_node_id=3, message_type="evaluate"), None, app)  # not a train job
    started, done = [json.loads(line) for line in path.read_text().splitlines()]
    assert started == {"created": request.metadata.created_at, "began": done["began"], "node": 3}
    assert done["began"] - done["created"] >= 0.05 and done["ended"] - done["began"] >= 0.05 and done["device"] == 0.04
    with path.open("a") as out:
        out.write('{"created": 1.0, "be')  # a line cut off as the run ended
    split = study.job_split(study.compact_stamps(study.read_stamps(path)), synchronous=False)
    assert split["jobs"] == 1 and split["first-wave-delivery-s-mean"] >= 0.05 and "delivery-s-mean" not in split


def test_a_job_split_by_hand_and_its_table(study):
    def job(created, began, ended=None, device=1.0):
        """The mod's lines for one job: one as its ClientApp starts, one as it ends (if it did)."""
        start = {"created": 100.0 + created, "began": 100.0 + began}
        return [start] + ([start | {"ended": 100.0 + ended, "device": device}] if ended else [])

    # asynchronous: each request after the first wave takes the oldest end before it not yet taken; a job still out
    # has a request, no end; the first wave (requested before any ClientApp was done: Ray's actors starting) is apart
    jobs = [*job(0.0, 1.5, 3.0), *job(0.0, 1.6, 5.0), *job(3.5, 3.7, 6.0, None), *job(5.2, 5.3),
            *job(6.6, 6.9, 9.0, 2.0)]
    stamps = study.compact_stamps(jobs)
    assert stamps[4:7] == [[3.5, 3.7, None, None, None], [3.5, 3.7, 6.0, None, None], [5.2, 5.3, None, None, None]]
    assert study.job_split([stamp[:4] for stamp in stamps], synchronous=False) == study.job_split(stamps, False)
    split = study.job_split(stamps, synchronous=False)
    assert split["jobs"] == 4 and split["jobs-after-the-first-wave"] == 2
    assert split["first-wave-delivery-s-mean"] == pytest.approx((1.5 + 1.6) / 2)
    assert split["delivery-s-mean"] == pytest.approx((0.2 + 0.3) / 2)
    assert split["clientapp-s-mean"] == pytest.approx((2.3 + 2.1) / 2)
    assert split["clientapp-device-s-mean"] == 2.0  # the job that reported none is left out
    assert split["next-request-s-mean"] == pytest.approx((0.5 + 0.2 + 0.6) / 3)  # 3.0->3.5, 5.0->5.2, 6.0->6.6
    # two ends close together, then one push of two requests (a held slot): one request each, in order
    close = [*job(0.0, 0.1, 4.0), *job(0.0, 0.1, 4.1), *job(5.0, 5.1), *job(5.0005, 5.1)]
    assert study.job_split(study.compact_stamps(close), synchronous=False)["next-request-s-mean"] == pytest.approx(
        (1.0 + 0.9005) / 2, abs=1e-3)
    # with nodes stamped: the wait after a node's first job (its reply time not yet learned) and after later ones
    noded = study.compact_stamps([{**line, "node": node} for node, lines in
                                  ((1, job(0.0, 0.1, 3.0)), (2, job(0.0, 0.1, 4.0)), (1, job(3.5, 3.6, 6.0)),
                                   (2, job(4.2, 4.3, 8.0)), (1, job(6.1, 6.2))) for line in lines])
    split = study.job_split(noded, synchronous=False)  # ends 3.0, 4.0, 6.0 -> requests 3.5, 4.2, 6.1
    assert split["next-request-after-first-s-mean"] == pytest.approx((0.5 + 0.2) / 2)
    assert split["next-request-after-later-s-mean"] == pytest.approx(0.1)
    assert "| 0.267 (after a node's first job 0.350, later 0.100) |" in study.split_table(
        {"here": [{"strategy": "fedasync", "job-stamps": noded}]})
    # synchronous: a round's last end to the next round's first request; a round with a job that left no end: none
    rounds = [*job(0.0, 0.1, 3.0), *job(0.0, 0.2, 9.0), *job(12.0, 12.1, 15.0), *job(12.002, 12.2, 14.0),
              *job(20.0, 20.1, 21.0), *job(20.001, 20.1), *job(30.0, 30.1)]
    split = study.job_split(study.compact_stamps(rounds), synchronous=True)
    assert split["next-request-s-mean"] == pytest.approx((3.0 + 5.0) / 2)  # 9.0 -> 12.0, 15.0 -> 20.0
    assert split["delivery-s-mean"] == pytest.approx((0.1 + 0.198 + 0.1) / 3)  # after the first wave
    assert study.job_split(study.compact_stamps(job(0.0, 0.1)), synchronous=False) == {}
    two_jobs = study.compact_stamps([*job(0.0, 0.2, 10.5, 10.0), *job(10.9, 11.1, 21.4, 10.0)])
    fedasync = {"strategy": "fedasync", "job-stamps": two_jobs, "evaluation-s-mean": 0.5, "server-ms-per-arrival": 4.0,
                "ray-actors": 6, "runtime-workers": 6}
    fedavg = {"strategy": "flower-fedavg",
              "job-stamps": study.compact_stamps([*job(0.0, 0.1, 9.3, 9.0), *job(11.8, 11.9, 21.1, 9.0)])}
    queued = {"strategy": "fedbuff", "job-stamps": two_jobs, "ray-actors": 8, "runtime-workers": 6}
    rows = study.split_table({"here": [fedasync, fedavg, queued, {"strategy": "ca2fl", "job-round-trip-s-mean": 1.0}]})
    # fedasync: the second job only after the first wave: 0.2 to the ClientApp, 10.3 in it (device 10.0); the first's
    # end to the next request 0.4; a slot's seconds beyond the device time 0.2 + 0.3 + 0.4. FedAvg: 11.8 - 9.3
    assert rows.splitlines()[2:] == [
        "| here | flower-fedavg | 1 | 2 | 9.20 (9.00) | 0.1 | 0.100 | 2.500 | – | – | – |",
        "| here | fedbuff | 1 | 2 | 10.30 (10.00) | 0.2 | 0.200 (queued for a worker) | 0.400 | – | – | – |",
        "| here | fedasync | 1 | 2 | 10.30 (10.00) | 0.2 | 0.200 | 0.400 | 0.900 | 0.500 | 4.0 |"]


def test_the_accuracy_s_move_between_evaluations_by_hand(study):
    cells = [{"strategy": "fedasync", "rounds": 4, "timeline": [[0, 0.0, 0.1], [1, 5.0, 0.5], [2, 9.0, 0.6],
                                                                 [3, 12.0, 0.4], [4, 15.0, 0.7], [5, 18.0, 0.1]]},
             {"strategy": "fedasync", "rounds": 4, "timeline": [[2, 9.0, 0.5], [3, 12.0, 0.5], [3, 13.0, 0.9],
                                                                 [4, 15.0, 0.6]]},  # round 3's last: 0.9
             {"strategy": "flower-fedavg", "rounds": 4, "timeline": [[4, 15.0, 0.7]]}]  # one point: no move
    # rounds 2-4 only: |0.4 - 0.6| and |0.7 - 0.4| (mean 0.25); |0.9 - 0.5| and |0.6 - 0.9| (mean 0.35)
    assert study.movement_table({"here": cells}).splitlines()[2:] == ["| here | fedasync | 2 | 0.300; 0.250-0.350 |"]


def test_the_status_table_pools_each_settings_runs_and_marks_the_issue_s_targets_by_hand(study, tmp_path):
    import json

    fleet = [1.0] * 8  # 8 equal nodes, 1 s a job: ideal 8 updates/s; 6 workers in simulation: bound 6/s
    base = {"example": "quickstart-pytorch", "mode": "simulation", "fleet": fleet, "device-seconds": 1.0,
            "ideal-updates-per-s": 8.0, "runtime-workers": 6}
    fedavg = [{**base, "strategy": "flower-fedavg", "final": final, "train-seconds": s, "timeline": timeline,
               "steady-updates-per-s": rate}
              for final, s, timeline, rate in ((0.80, 100.0, [[1, 100.0, 0.80]], 7.2),
                                               (0.82, 120.0, [[1, 99.0, 0.82]], 6.4))]  # target 0.81, mean 110 s
    a = [{**base, "strategy": "fedasync", "final": 0.825, "steady-updates-per-s": 7.6, "rejected-updates": 0,
          "timeline": [[1, 20.0, 0.5], [2, 44.0, 0.81]]},
         {**base, "strategy": "fedasync", "final": 0.805, "steady-updates-per-s": 7.44, "rejected-updates": 1,
          "timeline": [[1, 20.0, 0.5], [2, 55.0, 0.9]]}]
    b = [{**base, "strategy": "fedbuff", "start-options": "dispatch_hold=0.0", "final": 0.79,
          "steady-updates-per-s": 4.0, "timeline": [[1, 30.0, 0.7]]}]  # never reaches 0.81
    for folder, cells in (("avg", fedavg), ("one", a[:1]), ("two", a[1:] + b)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    rows = study.status_table(tmp_path, (("app", ("avg",), ("one", "two")),)).splitlines()[2:]
    # FedAvg's own runs first, against their own mean (the yardstick: -1.0 and +1.0 points, one run never reaches it;
    # rounds of 8 jobs on 8 equal nodes, 1 s: 8/s ideal, on 6 workers 2 s: 4/s bound), then FedBuff (the study's
    # order); FedAsync pooled over both folders: +1.5 and -0.5 points (within one), 44 and 55 s of FedAvg's 110 (0.40,
    # 0.50: at most half), 0.95 and 0.93 of the fleet's 8/s, 1.27 and 1.24 of the 6/s bound; Welch's interval of its
    # mean against FedAvg's -1 and +1: variances 2 / 2 runs on each side, so sqrt(2) x t(0.975, 2 df) = 4.303 sqrt(2)
    assert rows == ["| app | flower-fedavg (its own runs) | – | 2 (2) | +0.0; -1.0 | 0.90; never | 0.85; 0.80 | 1.70 "
                    "| – | ✓, –, ✗ |",
                    "| app | fedbuff | dispatch_hold=0.0 | 1 (2) | -2.0; -2.0 | never | 0.50; 0.50 | 0.67 | 0 | ✗, ✗, ✗ |",
                    "| app | fedasync | – | 2 (2) | +0.5 ± 6.1; -0.5 | 0.45; 0.50 | 0.94; 0.93 | 1.25 | 1 | ✓, ✓, ✓ |"]


def test_welch_s_interval_by_hand(study):
    # a: 1, 3 (variance 2), b: 0, 0, 6 (variance 12): se^2 = 2/2 + 12/3 = 5, df = 25 / (1/1 + 16/2) = 25/9
    from scipy.stats import t

    assert study.welch_half_width([1.0, 3.0], [0.0, 0.0, 6.0]) == pytest.approx(t.ppf(0.975, 25 / 9) * 5**0.5)
    assert study.welch_half_width([1.0], [0.0, 2.0]) is None  # one run: no spread to read
    assert study.welch_half_width([1.0, 1.0], [2.0, 2.0]) is None  # no spread on either side


def test_the_runtime_patch_widens_only_the_runtime_s_pool_of_flower_s_simulation_process(study, tmp_path):
    """WIDE_RUNTIME, as --runtime-workers writes it: in a process named flwr-simulation, an unsized pool made in a
    file named vce_api.py gets the given size and is marked; a sized pool, a pool made elsewhere and any pool of
    another process keep theirs."""
    import subprocess

    site, mark = tmp_path / "site", tmp_path / "mark"
    site.mkdir()
    (site / "sitecustomize.py").write_text(study.WIDE_RUNTIME.format(workers=8, mark=str(mark)))
    (tmp_path / "vce_api.py").write_text("from concurrent.futures import ThreadPoolExecutor\n"
                                         "def unsized():\n    return ThreadPoolExecutor()._max_workers\n")
    probe = ("import sys; sys.path.insert(0, {here!r}); import os, vce_api\n"
             "from concurrent.futures import ThreadPoolExecutor\n"
             "print(vce_api.unsized(), ThreadPoolExecutor(3)._max_workers, ThreadPoolExecutor()._max_workers)\n")
    default = min(32, (os.cpu_count() or 1) + 4)
    for name, expected in (("flwr-simulation", f"8 3 {default}"), ("flwr-serverapp", f"{default} 3 {default}")):
        script = tmp_path / name
        script.write_text(probe.format(here=str(tmp_path)))
        env = {**os.environ, "PYTHONPATH": str(site)}
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=True)
        assert out.stdout.split() == expected.split()
    assert study.widened_pools(mark) == [8]  # one mark: the runtime's pool in the simulation process
