"""What the wall clock's journal costs per reply: its write against the former journal's and Flower's serde.

A ResNet-18-sized reply (11M float32 in 20 arrays, 44 MB) is written three ways into memory, each the
median of 5 timings in one run on this machine: the journal as it is (``asyncfl.server_app.journal``:
the model record's bytes as they came, its other records through Flower's serde), the former journal
(``np.save`` of the flat update), and the whole record through Flower's serde. Ratios are the point.

Usage: ``.venv/bin/python benchmarks/journal_cost.py``
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict  # noqa: E402
from flwr.common import serde  # noqa: E402

from asyncfl.server_app.journal import _parts  # noqa: E402
from timing import median_seconds  # noqa: E402


def _ms(write, repeats: int = 5) -> float:
    return median_seconds(write, repeats) * 1000


def main() -> None:
    rng = np.random.default_rng(0)
    arrays = {f"layer{i}": rng.random(11_000_000 // 20, dtype=np.float32) for i in range(20)}
    reply = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                        "metrics": MetricRecord({"num-examples": 50, "train-loss": 0.5})})
    flat = np.concatenate(list(arrays.values()))

    def journal_now() -> None:
        layout, payload, small = _parts(reply, "arrays", len(arrays) + 1)
        out = io.BytesIO()
        for part in [*payload, np.frombuffer(small, dtype=np.uint8)]:
            np.save(out, part)

    now = _ms(journal_now)
    former = _ms(lambda: np.save(io.BytesIO(), flat))
    whole = _ms(lambda: serde.recorddict_to_proto(reply).SerializeToString())
    print(f"journal write per 44 MB reply: {now:.0f} ms; former journal (flat update) {former:.0f} ms "
          f"({now / former:.2f}x); whole record through Flower's serde {whole:.0f} ms ({now / whole:.2f}x)")


if __name__ == "__main__":
    main()
