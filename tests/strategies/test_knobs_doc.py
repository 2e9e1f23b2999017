"""docs/knobs.md is generated from the knobs' declarations: it and the code agree, and every knob has help."""

import dataclasses
import importlib.util
from pathlib import Path

from asyncfl.options import RunOptions
from asyncfl.strategies.registry import STRATEGY_CLASSES, strategy_class
from asyncfl.strategies.settings import _parameters

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("knobs_doc", ROOT / "scripts" / "knobs_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_knobs_page_is_what_the_declarations_generate():
    generator = _generator()
    assert generator.doc_section(generator.DOC.read_text()) == generator.section(), \
        "docs/knobs.md is stale: run .venv/bin/python scripts/knobs_doc.py --write"


def test_every_knob_is_described_by_its_declaration():
    classes = [RunOptions] + [strategy_class(name).config_class for name in STRATEGY_CLASSES]
    for cls in classes:
        rows = cls.described()
        assert [row["keyword"] for row in rows] == [f.name for f in dataclasses.fields(cls)]
        assert all(row["help"] for row in rows), [row["keyword"] for row in rows if not row["help"]]


def test_the_parameters_reader_takes_shared_entries_and_stops_at_the_next_section():
    doc = """Summary.

    Parameters
    ----------
    low, high : float
        Inclusive bounds,
        over two lines.
    name : str
        A name.

    Returns
    -------
    int
        Not a parameter.
    """
    assert _parameters(doc) == [(["low", "high"], "Inclusive bounds, over two lines."), (["name"], "A name.")]
    assert _parameters("No sections.") == [] and _parameters(None) == []


def test_the_app_s_pyproject_declares_every_strategy_knob_as_the_declarations_generate():
    # Flower refuses a run-config key its app does not declare: every knob's default is in pyproject.toml, written
    # there by the generator (a method with knobs: its module, then scripts/knobs_doc.py --write)
    generator = _generator()
    text = generator.PYPROJECT.read_text()
    begin, end = text.index(generator.TOML_BEGIN), text.index(generator.TOML_END) + len(generator.TOML_END)
    assert text[begin:end] == generator.pyproject_section(), \
        "pyproject.toml's strategy knobs are stale: run .venv/bin/python scripts/knobs_doc.py --write"
