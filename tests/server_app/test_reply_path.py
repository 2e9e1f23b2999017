"""docs/engine.md's traced reply path is the trace's: a change to the path changes the doc (issue 58)."""

from tests.scripts import load_script


def test_the_reply_path_in_the_engine_doc_is_a_fresh_trace():
    reply_path = load_script("benchmarks/reply_path.py", "reply_path")
    generated = reply_path.section(reply_path.traced_calls())
    assert reply_path.doc_section(reply_path.DOC.read_text()) == generated, (
        "docs/engine.md's reply path differs from a fresh trace: run .venv/bin/python benchmarks/reply_path.py --write")
