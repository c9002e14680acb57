"""What one cross-core wake-up costs on this machine, for the header of docs/benchmarks.md.

Every batched request hands work between threads (I/O thread -> instance ->
ONNX Runtime's pool -> I/O thread), and each hand-off to a sleeping thread
on another core pays the machine's wake-up: a few microseconds on bare
metal, tens on a virtual machine whose idle vCPUs halt at once (a KVM guest
with `guest_halt_poll_ns` at 0, where the wake must go through the host).
That cost moves the batched targets without any change to the server, so
the report states it beside the figures.

Two processes hand one byte back and forth over pipes, one pinned to core 0
and one to core 1, each sleeping in read() between turns; the same with
both on core 0 gives the round trip without a cross-core wake. Also records
the guest's halt-polling settings when the kernel has them.

    python3 bench/wake_cost.py OUT.json [-n 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

HALTPOLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
CPUIDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")


def round_trips(parent_core: int, child_core: int, n: int) -> list[int]:
    """Nanoseconds per round trip, sorted; the child answers each byte with one.

    Each side closes the pipe ends it does not use, so that either one
    ending early shows the other an end of file instead of a read that
    never returns.
    """
    allowed = os.sched_getaffinity(0)
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(to_child_w)
            os.close(to_parent_r)
            os.sched_setaffinity(0, {child_core})
            while os.read(to_child_r, 1):
                os.write(to_parent_w, b"x")
        finally:
            os._exit(0)
    os.close(to_child_r)
    os.close(to_parent_w)
    try:
        os.sched_setaffinity(0, {parent_core})
        samples = []
        for _ in range(n):
            start = time.perf_counter_ns()
            os.write(to_child_w, b"x")
            if not os.read(to_parent_r, 1):
                raise RuntimeError(f"the process pinned to core {child_core} stopped answering")
            samples.append(time.perf_counter_ns() - start)
    finally:
        os.close(to_child_w)
        os.close(to_parent_r)
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, allowed)
    return sorted(samples)


def summary(samples: list[int]) -> dict[str, float]:
    def at(q: float) -> float:
        return round(samples[min(len(samples) - 1, int(q * len(samples)))] / 1000, 1)

    return {"p50_us": at(0.5), "p99_us": at(0.99)}


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("-n", type=int, default=20000, help="round trips per layout")
    args = parser.parse_args()

    result: dict[str, object] = {
        "cpuidle_driver": read(CPUIDLE_DRIVER),
        "guest_halt_poll_ns": read(HALTPOLL),
        "same_core": summary(round_trips(0, 0, args.n)),
    }
    if {0, 1} <= os.sched_getaffinity(0):
        result["cross_core"] = summary(round_trips(0, 1, args.n))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
