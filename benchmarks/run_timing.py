"""Reading a run's ``timing.csv`` (one row per evaluation point: virtual time, arrivals, wall seconds)."""

from __future__ import annotations

from pathlib import Path


def timing_rows(path: Path) -> list[tuple[int, float]]:
    """``(arrivals, wall seconds)`` of each complete row written so far; empty while the file does not exist."""
    try:
        lines = path.read_text().splitlines()[1:]
    except OSError:
        return []
    rows = []
    for line in lines:
        fields = line.split(",")
        if len(fields) == 3:
            rows.append((int(fields[1]), float(fields[2])))
    return rows


def steady_arrivals_per_s(rows: list[tuple[int, float]], from_share: float) -> float:
    """Arrivals per wall second from the first row past ``from_share`` of the final arrivals to the last row
    (start-up, Ray workers starting and the first jobs, left out)."""
    first = next(r for r in rows if r[0] >= from_share * rows[-1][0])
    return (rows[-1][0] - first[0]) / max(rows[-1][1] - first[1], 1e-9)
