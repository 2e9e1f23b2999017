"""A doc's generated section: the text between two markers, replaced by what a generator writes.

Used by the scripts that write parts of ``docs/`` from the code (``scripts/knobs_doc.py``,
``benchmarks/reply_path.py``), whose tests fail when a doc's section and a fresh generation disagree.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable


def doc_section(text: str, begin: str, end: str) -> str:
    """The generated part of ``text``: from ``begin`` to ``end``, both markers included."""
    start = text.index(begin)
    return text[start:text.index(end, start) + len(end)]


def print_or_write(doc: Path, begin: str, end: str, generate: Callable[[], str], description: str) -> None:
    """The command line of a generator: print the section; with ``--write``, replace it in ``doc``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"replace the section in {doc.name}")
    args = parser.parse_args()
    generated = generate()
    print(generated)
    if args.write:
        text = doc.read_text()
        doc.write_text(text.replace(doc_section(text, begin, end), generated))
