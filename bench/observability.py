"""What observability costs: nereid-server at concurrency 32 (gRPC, identity
FP32[1,16], nereid-perf) with metrics off, metrics on (tracing off), and
tracing every request (rate 1) to a local OTLP receiver, in one run,
alternating the configurations over several rounds. Reports throughput,
the server's CPU time per request (from /proc/<pid>/stat around the run,
divided by the requests the statistics API counted) and the ratios to
metrics off. A benchmark, not a test: nothing fails on a timing.

    .venv/bin/python bench/observability.py --bin target/release [--rounds 3] [--write docs/observability.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import requests
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
TICKS = os.sysconf("SC_CLK_TCK")


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    """A local OTLP receiver that counts spans and keeps nothing."""

    def __init__(self) -> None:
        self.spans = 0
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802
        n = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self.lock:
            self.spans += n
        return trace_service_pb2.ExportTraceServiceResponse()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start_server(binary: Path, extra: list[str], log: Path) -> tuple[subprocess.Popen, str, str]:
    cmd = [
        str(binary), "--model-repository", str(REPO / "examples" / "models"),
        "--http-address", HOST, "--http-port", "0", "--grpc-address", HOST, "--grpc-port", "0",
        "--metrics-address", HOST, "--metrics-port", "0", *extra,
    ]
    out = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log.read_text()
        http = re.search(r"Started HTTPService at ([0-9.:]+)", text)
        grpc_addr = re.search(r"Started GRPCInferenceService at ([0-9.:]+)", text)
        if http and grpc_addr:
            return proc, http.group(1), grpc_addr.group(1)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}")


def successes(http: str) -> int:
    stats = requests.get(f"http://{http}/v2/models/identity/stats", timeout=10).json()
    return stats["model_stats"][0]["inference_stats"]["success"]["count"]


def measure(binary: Path, perf: Path, extra: list[str], interval_ms: int, work: Path) -> dict:
    proc, http, grpc_addr = start_server(binary, extra, work / "server.log")
    try:
        subprocess.run(
            [str(perf), "--protocol", "grpc", "-u", grpc_addr, "-m", "identity", "--shape", "INPUT0:1,16",
             "--concurrency-list", "32", "--measurement-interval", "500"],
            check=True, capture_output=True,
        )  # warm-up
        cpu0, done0 = cpu_seconds(proc.pid), successes(http)
        result = work / "perf.json"
        subprocess.run(
            [str(perf), "--protocol", "grpc", "-u", grpc_addr, "-m", "identity", "--shape", "INPUT0:1,16",
             "--concurrency-list", "32", "--measurement-interval", str(interval_ms), "--json", str(result)],
            check=True, capture_output=True,
        )
        cpu1, done1 = cpu_seconds(proc.pid), successes(http)
        row = json.loads(result.read_text())[0]
        return {
            "throughput": row["throughput"],
            "p50_us": row["p50_us"],
            "cpu_us_per_request": (cpu1 - cpu0) / max(done1 - done0, 1) * 1e6,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", type=Path, default=REPO / "target" / "release")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--interval-ms", type=int, default=5000)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()

    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    configs = {
        "metrics off": ["--allow-metrics=false"],
        "metrics on, tracing off": [],
        "metrics on, tracing rate 1": [
            "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
            "--trace-config", f"opentelemetry,url={HOST}:{port}",
        ],
    }
    results: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name, extra in configs.items():
                r = measure(args.bin / "nereid-server", args.bin / "nereid-perf", extra, args.interval_ms, Path(tmp))
                results[name].append(r)
                print(f"round {round_ + 1} {name}: {r['throughput']:.0f} req/s, "
                      f"{r['cpu_us_per_request']:.1f} us CPU/request, p50 {r['p50_us']} us", flush=True)
    server.stop(grace=None)

    median = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in results.items()}
    # The machine drifts between rounds by more than the effect measured, so
    # each configuration is compared with the metrics-off run of its own
    # round (they ran back to back), and the median of those ratios is shown.
    def paired(name: str, key: str) -> float:
        return statistics.median(r[key] / b[key] for r, b in zip(results[name], results["metrics off"]))

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    lines = [
        "# What observability costs",
        "",
        f"`bench/observability.sh` on commit {commit}: nereid-server (release), gRPC identity FP32[1,16],",
        f"concurrency 32, nereid-perf on the same {os.cpu_count()} cores; {args.rounds} rounds, each running the",
        f"three configurations back to back for {args.interval_ms} ms windows. Absolute figures are medians over",
        "the rounds; the ratios are medians of each round's ratio to that round's metrics-off run, since",
        "the machine drifts between rounds by more than the effect measured. CPU per request is the",
        "server's user+system time from /proc/<pid>/stat around the run, divided by the requests the",
        "statistics API counted.",
        "",
        "| configuration | req/s | vs metrics off | server CPU us/request | vs metrics off | p50 us |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in median.items():
        lines.append(
            f"| {name} | {m['throughput']:.0f} | {paired(name, 'throughput'):.3f} | "
            f"{m['cpu_us_per_request']:.1f} | {paired(name, 'cpu_us_per_request'):.3f} | {m['p50_us']:.0f} |"
        )
    lines += ["", "Throughput of each round, req/s:", "", "| round | " + " | ".join(configs) + " |",
              "|---|" + "---|" * len(configs)]
    for i in range(args.rounds):
        lines.append(f"| {i + 1} | " + " | ".join(f"{results[n][i]['throughput']:.0f}" for n in configs) + " |")
    traced = median["metrics on, tracing rate 1"]["cpu_us_per_request"] - median["metrics on, tracing off"]["cpu_us_per_request"]
    lines += [
        "",
        f"Tracing every request costs about {traced:.1f} us of server CPU per request "
        f"({sink.spans} spans received by the local OTLP receiver).",
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if args.write:
        args.write.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
