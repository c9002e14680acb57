"""Where the CPU goes per request: each thread group of the server and of the load generator beside it.

`bench/run.sh` gives the server's CPU per request as one figure. When a
target is missed on a machine whose cores the server shares with the load
generator, the question is which threads spend it: the I/O threads, an
instance with its ONNX Runtime pool, or nereid-perf itself, and how often
each sleeps and is woken (a wake-up is expensive on a VM whose idle vCPUs
halt: bench/wake_cost.py). This starts nereid-server (or the bare echo
server), loads it with nereid-perf at one concurrency, and reads
`/proc/<pid>/task/*/{stat,status}` of both processes and `/proc/stat` over a
window inside the load. Threads are grouped by name: the server's I/O
threads are `nereid-io`, an instance thread is `<model>-<version>-<index>`
(ONNX Runtime's pool threads inherit it; Linux keeps 15 characters of a
name), nereid-perf's are tokio's.

    source scripts/setup.sh   # ONNX Runtime's library, for the server's ONNX models
    python3 bench/thread_cpu.py [--echo] [--model mlp_small] [--protocol http] [-c 64]

Binaries come from target/release (`cargo build --release -p nereid-server
-p nereid-bench`); every process started is stopped by its PID; everything
talks to 127.0.0.1. A measurement, not a test: it asserts nothing about
timings.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# nereid-perf's warm-up, then its one window: the window read from /proc
# starts MARGIN_S after the warm-up and ends MARGIN_S before the window does,
# so nereid-perf's rate is the rate over it (its start-up, well under a
# margin, comes out of the first one).
WARMUP_S = 1.0
MARGIN_S = 0.75


def thread_groups(pid: int) -> dict[str, list[int]]:
    """Per thread name: [CPU ticks (user + system), voluntary, involuntary switches], summed."""
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except FileNotFoundError:
            continue  # the thread ended between the listing and the read
        # The name is in parentheses and may hold spaces; the fields after it are fixed.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = dict(re.findall(r"^(\w*voluntary_ctxt_switches):\s+(\d+)$", status, re.M))
        group = groups[name]
        group[0] += int(fields[11]) + int(fields[12])  # utime, stime
        group[1] += int(switches["voluntary_ctxt_switches"])
        group[2] += int(switches["nonvoluntary_ctxt_switches"])
    return dict(groups)


def machine_ticks() -> tuple[int, int]:
    """All CPUs' (total, idle + iowait) ticks from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


def wait_for(log: Path, pattern: str, process: subprocess.Popen, timeout_s: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"no line matching {pattern!r} in {log}:\n{log.read_text()}")


def start_target(args: argparse.Namespace, bin_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """Starts the echo server or nereid-server; returns it and the address for the protocol.

    A target that never becomes ready is stopped before the error goes up.
    """
    process = spawn_target(args, bin_dir, log)
    try:
        return process, ready_address(args, log, process)
    except BaseException:
        stop(process)
        raise


def spawn_target(args: argparse.Namespace, bin_dir: Path, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        if args.echo:
            command = [bin_dir / "nereid-echo", "--address", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
                       "--input", "INPUT0:FP32:-1,256"]
        else:
            repositories = [a for r in args.repository for a in ("--model-repository", r)]
            command = [bin_dir / "nereid-server", *repositories, "--http-address", "127.0.0.1", "--http-port", "0",
                       "--grpc-address", "127.0.0.1", "--grpc-port", "0", "--metrics-port", "0"]
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def ready_address(args: argparse.Namespace, log: Path, process: subprocess.Popen) -> str:
    """The target's address for the protocol, once it listens (and, for the server, the model is ready)."""
    if args.echo:
        line = wait_for(log, r"listening.*", process).group(0)
        return re.search(rf"{'grpc' if args.protocol == 'grpc' else 'http'}=(\S+)", line).group(1)
    http = wait_for(log, r"Started HTTPService at ([0-9.:]+)", process).group(1)
    grpc = wait_for(log, r"Started GRPCInferenceService at ([0-9.:]+)", process).group(1)
    # The ports open before every model has loaded.
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://{http}/v2/models/{args.model}/ready", timeout=5):
                break
        except OSError as e:  # refused, or an HTTP error status while it loads
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"model '{args.model}' did not become ready: {e}\n{log.read_text()}") from e
            time.sleep(0.1)
    return grpc if args.protocol == "grpc" else http


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="thread-cpu-") as work:
        return measure_in(args, Path(work))


def measure_in(args: argparse.Namespace, work: Path) -> dict:
    bin_dir = Path(args.bin)
    target, address = start_target(args, bin_dir, work / "target.log")
    load = None
    try:
        model = "echo" if args.echo else args.model
        extra = ["--datatype", "INPUT0:FP32"] if args.echo else []
        with (work / "perf.log").open("w") as perf_log:
            load = subprocess.Popen(
                [bin_dir / "nereid-perf", "--protocol", args.protocol, "-u", address, "-m", model,
                 "--shape", args.shape, *extra, "--concurrency-list", str(args.concurrency),
                 "--warmup", str(int(WARMUP_S * 1000)),
                 "--measurement-interval", str(int((args.seconds + 2 * MARGIN_S) * 1000)),
                 "--max-trials", "1", "--json", work / "perf.json"],
                stdout=subprocess.DEVNULL, stderr=perf_log,
            )
        time.sleep(WARMUP_S + MARGIN_S)
        before = {"server": thread_groups(target.pid), "client": thread_groups(load.pid)}
        machine_before = machine_ticks()
        time.sleep(args.seconds)
        after = {"server": thread_groups(target.pid), "client": thread_groups(load.pid)}
        machine_after = machine_ticks()
        if load.wait(timeout=60) != 0:
            raise RuntimeError(f"nereid-perf failed:\n{(work / 'perf.log').read_text()}")
        rate = json.loads((work / "perf.json").read_text())[0]["throughput"]
        if rate <= 0:
            raise RuntimeError(f"no request succeeded:\n{(work / 'perf.log').read_text()}")
    finally:
        if load is not None and load.poll() is None:
            load.kill()
            load.wait()
        stop(target)
    requests = rate * args.seconds
    total, idle = (a - b for a, b in zip(machine_after, machine_before))
    groups = []
    for side in ("server", "client"):
        for name, end in sorted(after[side].items()):
            start = before[side].get(name, [0, 0, 0])
            ticks, voluntary, involuntary = (e - s for e, s in zip(end, start))
            if ticks or voluntary or involuntary:
                groups.append({
                    "side": side,
                    "threads": name,
                    "cpu_us_per_request": ticks / CLOCK_TICKS * 1e6 / requests,
                    "voluntary_switches_per_request": voluntary / requests,
                    "involuntary_switches_per_request": involuntary / requests,
                })
    return {
        "target": "nereid-echo" if args.echo else f"nereid-server {args.model}",
        "protocol": args.protocol,
        "concurrency": args.concurrency,
        "requests_per_s": rate,
        "idle_percent": 100 * idle / total if total else 0.0,
        "busy_us_per_request": (total - idle) / CLOCK_TICKS * 1e6 / requests,
        "groups": groups,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--echo", action="store_true", help="measure the bare echo server instead of nereid-server")
    parser.add_argument("--model", default="mlp_small")
    parser.add_argument("--repository", action="append", help="model repository (repeatable; default examples/models)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("-c", "--concurrency", type=int, default=64)
    parser.add_argument("--shape", default="INPUT0:1,256")
    parser.add_argument("--seconds", type=float, default=3.0, help="the window read from /proc")
    parser.add_argument("--bin", default=str(REPO / "target/release"))
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    args.repository = args.repository or [str(REPO / "examples/models")]
    if not args.echo and "ORT_DYLIB_PATH" not in os.environ:
        parser.error("ORT_DYLIB_PATH is not set: run `source scripts/setup.sh` first, for the ONNX Runtime library")

    result = measure(args)
    print(
        f"{result['target']} over {result['protocol']}, c={result['concurrency']}: "
        f"{result['requests_per_s']:.0f} requests/s; the machine {result['idle_percent']:.1f} % idle, "
        f"{result['busy_us_per_request']:.1f} us busy per request"
    )
    print(f"{'':8}{'threads':<20}{'CPU us/request':>15}{'voluntary':>11}{'involuntary':>13}  switches/request")
    for g in result["groups"]:
        print(
            f"{g['side']:<8}{g['threads']:<20}{g['cpu_us_per_request']:>15.1f}"
            f"{g['voluntary_switches_per_request']:>11.3f}{g['involuntary_switches_per_request']:>13.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
