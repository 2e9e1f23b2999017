"""How late the wall-clock puller notices replies, and what that costs an emulated fleet's rate.

The real ``ThreadedPuller`` on a fake clock: ``in_flight`` jobs always out on the fleet of a device profile
(a freed slot going to the node idle longest), each job ready ``slowdown x device-seconds`` after it is sent
(times a lognormal factor of spread ``jitter`` where asked), the engine polling every ``beat`` seconds as its
pacer does while nothing arrives. A reply's notice delay is the time from when it is ready to the poll that
hands it over; the next job goes out then, so the delays also lower the fleet's rate. Compared: the age rule
alone (``fine`` 0, the puller before it learned reply times) and the learned reply time (asyncfl's default).
No Flower, no threads racing a real clock: every figure is the schedule's own, the same on any machine.

    .venv/bin/python benchmarks/wall_sooner/puller_notice.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from asyncfl.client_app.device_speed import DeviceProfile  # noqa: E402
from asyncfl.server_app.puller import ThreadedPuller  # noqa: E402


class _ReadyAt:
    """A grid whose replies are there from a given fake time on."""

    def __init__(self, now: list[float]) -> None:
        self.now, self.ready_at = now, {}

    def pull_messages(self, message_ids):
        return [m for m in message_ids if self.now[0] >= self.ready_at[m]]


def _drained(puller: ThreadedPuller) -> None:
    while puller._pending:  # the fake clock stands still until this beat's pulls are done
        time.sleep(0.0002)


def replay(profile: str = "quarter-5x-slower", nodes: int = 50, in_flight: int = 6, seconds: float = 6.0,
           seed: int = 0, fine: float = 0.05, jitter: float = 0.0, beat: float = 0.05,
           horizon: float = 1200.0) -> dict:
    """Notice delays, pulls per reply and the rate over ``horizon`` fake seconds, for one puller setting."""
    fleet = DeviceProfile.parse(profile).fleet(nodes, seed)
    rng = np.random.default_rng(seed)
    now = [0.0]
    grid = _ReadyAt(now)
    puller = ThreadedPuller(grid, workers=1, fine=fine, clock=lambda: now[0])
    idle, out, sent = list(range(in_flight, nodes)), {}, 0
    delays, durations, took = [], {}, []

    def send(node: int) -> None:
        nonlocal sent
        message_id = f"m{sent}"
        sent += 1
        durations[message_id] = fleet[node] * seconds * (float(rng.lognormal(0.0, jitter)) if jitter else 1.0)
        grid.ready_at[message_id] = now[0] + durations[message_id]
        out[message_id] = node

    for node in range(in_flight):
        send(node)
    while now[0] < horizon:
        replies = puller.poll(list(out), dict(out))
        _drained(puller)
        replies += puller.poll([], None)
        for message_id in replies:
            delays.append(now[0] - grid.ready_at[message_id])
            took.append(durations[message_id])
            node = out.pop(message_id)
            puller.forget(message_id)
            idle.append(node)
            send(idle.pop(0))
        now[0] = round(now[0] + beat, 9)
    done = len(delays)
    return {"fine": fine, "jitter": jitter, "replies": done, "notice-s-mean": float(np.mean(delays)),
            "notice-s-p90": float(np.quantile(delays, 0.9)), "pulls-per-reply": puller.pulls / max(done, 1),
            # a slot's job time against job time plus notice: the share of the fleet's rate the puller leaves it
            "rate-share": sum(took) / (sum(took) + sum(delays))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quarter-5x-slower")
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=6)
    parser.add_argument("--device-seconds", type=float, default=6.0)
    parser.add_argument("--horizon", type=float, default=1200.0, help="fake seconds replayed per setting")
    args = parser.parse_args()
    DeviceProfile.parse(args.profile)
    print("| puller | job-time jitter (lognormal sigma) | replies | notice delay mean (s) | p90 (s) "
          "| pulls per reply | share of the fleet's rate |")
    print("|---|---|---|---|---|---|---|")
    for jitter in (0.0, 0.05, 0.2):
        for fine, name in ((0.0, "age rule only"), (ThreadedPuller.FINE, "learned reply time")):
            r = replay(args.profile, args.nodes, args.in_flight, args.device_seconds, fine=fine, jitter=jitter,
                       horizon=args.horizon)
            print(f"| {name} | {jitter:g} | {r['replies']} | {r['notice-s-mean']:.3f} | {r['notice-s-p90']:.3f} "
                  f"| {r['pulls-per-reply']:.1f} | {r['rate-share']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
