"""The wire keys live in one module: no other asyncfl module spells asyncfl's own keys as literals."""

import ast
from pathlib import Path

from asyncfl import protocol

PACKAGE = Path(protocol.__file__).resolve().parent
# asyncfl's additions to Flower's messages (Flower's own keys, such as "num-examples", may stay literal)
OWN_KEYS = {protocol.MODEL_VERSION, protocol.JOB_SEED, protocol.DISPATCH_TIME, protocol.EMULATE_SECONDS,
            protocol.IDENTIFY, protocol.WANT_LABEL_COUNTS, protocol.LABEL_COUNTS, protocol.WORKER_RECORD,
            protocol.RAY_NODE, protocol.LOCAL_ACCURACY, protocol.REFUSED_MESSAGES,
            protocol.RESTARTED}


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """String constants that are not docstrings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_module_but_protocol_spells_a_wire_key():
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "protocol.py":
            continue
        for node in _code_strings(ast.parse(path.read_text())):
            if node.value in OWN_KEYS:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert found == [], "use asyncfl.protocol's names instead of: " + ", ".join(found)


def test_job_seeds_fit_a_config_record_and_differ_by_stream_and_counter():
    seeds = {protocol.job_seed(3, protocol.ENGINE_STREAM, n) for n in range(100)}
    seeds |= {protocol.job_seed(3, protocol.RELAY_STREAM, peer, event) for peer in range(10) for event in range(10)}
    assert len(seeds) == 200
    assert all(0 <= s < 2**63 for s in seeds)
    assert protocol.job_seed(3, protocol.ENGINE_STREAM, 5) == protocol.job_seed(3, protocol.ENGINE_STREAM, 5)


def test_a_replys_metrics_beyond_a_reports_size_are_cut_to_it_its_single_numbers_first():
    from flwr.app import MetricRecord, RecordDict

    from asyncfl import protocol

    honest = MetricRecord({"num-examples": 10, "train-loss": 0.5, "per-class": [0.1] * 100})
    assert protocol.reply_metrics(RecordDict({"metrics": honest})) is honest  # within the bounds: as sent
    bulky = MetricRecord({"per-class": [0.1] * 9_999, "x" * 201: 1.0, "num-examples": 10, "train-loss": 0.5,
                          **{f"m{i}": 1.0 for i in range(5)}})
    cut = protocol.reply_metrics(RecordDict({"metrics": bulky}))
    assert isinstance(cut, protocol.TrimmedMetrics)
    # single numbers first (the count, the loss, m0-m4: 7), then the list only if it fits the 10,000 in all (no)
    assert list(cut) == ["num-examples", "train-loss", *(f"m{i}" for i in range(5))]
    many = MetricRecord({f"m{i}": float(i) for i in range(1500)})
    assert list(protocol.reply_metrics(RecordDict({"metrics": many}))) == [f"m{i}" for i in range(1000)]
