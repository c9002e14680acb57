"""Reads bench/run.sh's results and prints the table, the ratios and the targets.

    .venv/bin/python bench/report.py bench/results [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

CONCURRENCIES = (1, 8, 32, 64)
MODELS = ("identity", "mlp_small", "mlp_large")
PROTOCOLS = ("grpc", "http")
PROTOCOL_NAMES = {"grpc": "gRPC", "http": "HTTP binary"}


def load(results: Path, name: str) -> list[dict]:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else []


def by_concurrency(rows: list[dict]) -> dict[int, dict]:
    return {row["concurrency"]: row for row in rows if row.get("concurrency") is not None}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def build(results: Path) -> str:
    out: list[str] = []
    compute = {m: load(results, f"compute-{m}") for m in ("mlp_small", "mlp_large")}
    echo = {p: by_concurrency(load(results, f"echo-{p}")) for p in PROTOCOLS}
    server = {(m, p): by_concurrency(load(results, f"server-{m}-{p}")) for m in MODELS for p in PROTOCOLS}

    out.append("## 1. Compute limit: in-process ONNX Runtime\n")
    out.append("| model | batch | inferences/s | p50 per execution (us) |")
    out.append("|---|---:|---:|---:|")
    best: dict[str, float] = {}
    batch1_p50: dict[str, float] = {}
    for model, rows in compute.items():
        for row in rows:
            out.append(f"| {model} | {row['batch_size']} | {row['inferences_per_s']:.0f} | {row['p50_us']} |")
            if row["batch_size"] == 1:
                batch1_p50[model] = row["p50_us"]
        if rows:
            top = max(rows, key=lambda r: r["inferences_per_s"])
            best[model] = top["inferences_per_s"]
            out.append(f"| **{model} best** | {top['batch_size']} | **{top['inferences_per_s']:.0f}** | |")
    out.append("")

    out.append("## 2. Transport limit: bare echo servers (tonic / hyper), FP32 [1,256]\n")
    out.append("| protocol | concurrency | infer/s | p50 (us) | p99 (us) | errors |")
    out.append("|---|---:|---:|---:|---:|---:|")
    for p in PROTOCOLS:
        for c in CONCURRENCIES:
            row = echo[p].get(c)
            if row:
                out.append(f"| {PROTOCOL_NAMES[p]} | {c} | {row['throughput']:.0f} | {row['p50_us']} | {row['p99_us']} | {row['errors']} |")
    out.append("")

    out.append("## 3. nereid-server, batch-1 requests\n")
    out.append("| model | protocol | concurrency | infer/s | p50 (us) | p99 (us) | errors | vs echo | vs compute best |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for m in MODELS:
        for p in PROTOCOLS:
            for c in CONCURRENCIES:
                row = server[(m, p)].get(c)
                if not row:
                    continue
                e = echo[p].get(c)
                vs_echo = row["throughput"] / e["throughput"] if e and e["throughput"] else None
                vs_compute = row["throughput"] / best[m] if m in best and best[m] else None
                out.append(
                    f"| {m} | {PROTOCOL_NAMES[p]} | {c} | {row['throughput']:.0f} | {row['p50_us']} | {row['p99_us']} "
                    f"| {row['errors']} | {fmt_ratio(vs_echo)} | {fmt_ratio(vs_compute)} |"
                )
    out.append("")

    out.append("## Targets\n")
    out.append("| target | measured | goal | |")
    out.append("|---|---:|---:|---|")
    large = server[("mlp_large", "grpc")].get(64)
    if large and best.get("mlp_large"):
        r = large["throughput"] / best["mlp_large"]
        out.append(f"| mlp_large gRPC c64 / in-process best | {r:.2f} | >= 0.85 | {verdict(r >= 0.85)} |")
    for m in ("identity", "mlp_small"):
        for p in PROTOCOLS:
            for c in (8, 64):
                row, e = server[(m, p)].get(c), echo[p].get(c)
                if row and e and e["throughput"]:
                    r = row["throughput"] / e["throughput"]
                    out.append(f"| {m} {PROTOCOL_NAMES[p]} c{c} / echo | {r:.2f} | >= 0.80 | {verdict(r >= 0.8)} |")
    for p in PROTOCOLS:
        row, e = server[("mlp_small", p)].get(1), echo[p].get(1)
        if row and e and "mlp_small" in batch1_p50:
            budget = e["p50_us"] + batch1_p50["mlp_small"] + 50
            out.append(
                f"| mlp_small {PROTOCOL_NAMES[p]} c1 p50 (us) | {row['p50_us']} | <= {budget:.0f} "
                f"(echo {e['p50_us']} + compute {batch1_p50['mlp_small']:.0f} + 50) | {verdict(row['p50_us'] <= budget)} |"
            )
    idle_file = results / "server-idle-rss-kib.txt"
    if idle_file.exists():
        rss_mib = int(idle_file.read_text().strip()) / 1024
        out.append(f"| server RSS, idle, examples/models loaded | {rss_mib:.0f} MiB | < 100 MiB | {verdict(rss_mib < 100)} |")
    rss_file = results / "server-rss-kib.txt"
    if rss_file.exists():
        rss_mib = int(rss_file.read_text().strip()) / 1024
        out.append(f"| server RSS, idle, examples/models + bench/models (96 MiB of mlp_large weights) | {rss_mib:.0f} MiB | (report) | |")
    out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--write", type=Path, help="also write the markdown report here")
    args = parser.parse_args()
    body = build(args.results)
    print(body)
    if args.write:
        header = [
            "# Benchmarks",
            "",
            f"Produced by `bench/run.sh` on {datetime.date.today().isoformat()}: "
            f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.release()}, no GPU.",
            "Client (nereid-perf) and server share the machine and its cores; nothing is pinned, since with two",
            "cores pinning would leave ONNX Runtime a single thread. Read the figures as this machine's, not the",
            "server's alone. Throughput is successful inferences per second; latencies are per request, measured",
            "by the client. Ratios compare against baselines measured in the same run.",
            "",
        ]
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text("\n".join(header) + body + "\n")


if __name__ == "__main__":
    main()
