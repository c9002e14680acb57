"""Reads bench/run.sh's results and prints the tables, the ratios and the targets.

    .venv/bin/python bench/report.py bench/results [--write docs/benchmarks.md]

With --write, only the part of the file between its two markers is replaced,
so the hand-written sections around it (the gateway, ensembles, VAD, the
profiles before a change) survive a new run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
from dataclasses import dataclass
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


@dataclass
class Round:
    """Everything one target reads, measured close together in time."""

    echo: dict[str, dict[int, dict]]
    echo_free: dict[str, dict[int, dict]]
    server: dict[tuple[str, str], dict[int, dict]]
    best: dict[str, float]


def best_of(rows: list[dict]) -> float | None:
    """The best single-session throughput over the batch sizes measured."""
    single = [r["inferences_per_s"] for r in rows if r.get("sessions", 1) == 1]
    return max(single) if single else None


def load_rounds(results: Path) -> list[Round]:
    """bench/run.sh's section 5: files named roundN-..., one Round per N."""
    numbers = sorted(
        int(m[1]) for f in results.glob("round*-server-identity-grpc.json") if (m := re.match(r"round(\d+)-", f.name))
    )
    rounds = []
    for n in numbers:
        best = {m: b for m in ("mlp_small", "mlp_large") if (b := best_of(load(results, f"round{n}-compute-{m}")))}
        rounds.append(
            Round(
                echo={p: by_concurrency(load(results, f"round{n}-echo-{p}")) for p in PROTOCOLS},
                echo_free={p: by_concurrency(load(results, f"round{n}-echo-free-{p}")) for p in PROTOCOLS},
                server={(m, p): by_concurrency(load(results, f"round{n}-server-{m}-{p}")) for m in MODELS for p in PROTOCOLS},
                best=best,
            )
        )
    return rounds


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def wake_cost(results: Path) -> str:
    """The header's sentence on bench/wake_cost.py's figures, or nothing when they are missing."""
    path = results / "wake-cost.json"
    if not path.exists():
        return ""
    wake = json.loads(path.read_text())
    same = wake["same_core"]
    text = f"A pipe round trip between two processes takes {same['p50_us']} us p50 on one core"
    if cross := wake.get("cross_core"):
        text += f" and {cross['p50_us']} us across two (p99 {cross['p99_us']})"
    if wake.get("guest_halt_poll_ns") is not None:
        text += f"; the guest's halt polling is {wake['guest_halt_poll_ns']} ns (Linux's default 200000)"
    return text + ": every batched request pays the cross-core wake-up several times (bench/wake_cost.py). "


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


# A line of `perf report --sort dso,symbol --stdio`: share, object, [k] or [.], frame.
PROFILE_LINE = re.compile(r"^\s*(?P<share>[\d.]+%)\s+(?P<object>\S+)\s+\[(?P<kind>.)\]\s+(?P<frame>.*?)[\s-]*$")


def cpu(row: dict | None) -> float | None:
    return None if not row else row.get("server_cpu_us_per_request")


def fmt_cpu(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def build(results: Path) -> str:
    out: list[str] = []
    # Each model in-process twice: one session on every core (the thread
    # settings the served models use, and so the limit they are read
    # against), and one single-threaded session per core side by side (as a
    # model with that many instances would run), for information.
    compute = {m: load(results, f"compute-{m}") + load(results, f"compute-{m}-sessions") for m in ("mlp_small", "mlp_large")}
    echo = {p: by_concurrency(load(results, f"echo-{p}")) for p in PROTOCOLS}
    echo_free = {p: by_concurrency(load(results, f"echo-free-{p}")) for p in PROTOCOLS}
    server = {(m, p): by_concurrency(load(results, f"server-{m}-{p}")) for m in MODELS for p in PROTOCOLS}
    commit_file = results / "commit.txt"
    commit = commit_file.read_text().strip() if commit_file.exists() else "unknown"

    out.append(
        f"Measured by `bench/run.sh` on {datetime.date.today().isoformat()} at commit `{commit}`: "
        f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.release()}, no GPU. "
        "Identity and the echo servers it is read against run pinned to core 0 with the load generator "
        "(nereid-perf) on core 1; the MLPs and their echo baseline run unpinned, since ONNX Runtime needs "
        "both cores. "
        f"{wake_cost(results)}"
        "Throughput is successful inferences per second; latencies are per request, measured "
        "by the client; server CPU per request is the server's user + system time from /proc over the "
        "windows the throughput comes from, divided by the requests answered in them. Ratios compare "
        "against baselines measured in the same run.\n"
    )

    out.append("## 1. Compute limit: in-process ONNX Runtime\n")
    out.append(
        "Sessions side by side, each on its own thread with its intra-op threads. The served models run as one "
        "instance on every core, so a model's best (the limit the targets use) is the best of the single "
        "session; the other layout is the one a model with an instance per core would have.\n"
    )
    out.append("| model | sessions x intra-op threads | batch | inferences/s | p50 per execution (us) |")
    out.append("|---|---|---:|---:|---:|")
    best: dict[str, float] = {}
    batch1_p50: dict[str, float] = {}
    for model, rows in compute.items():
        for row in rows:
            layout = f"{row.get('sessions', 1)} x {row['intra_op_threads']}"
            out.append(
                f"| {model} | {layout} | {row['batch_size']} | {row['inferences_per_s']:.0f} | {row['p50_us']} |"
            )
            if row["batch_size"] == 1 and row.get("sessions", 1) == 1:
                batch1_p50[model] = row["p50_us"]
        single = [r for r in rows if r.get("sessions", 1) == 1]
        if single:
            top = max(single, key=lambda r: r["inferences_per_s"])
            best[model] = top["inferences_per_s"]
            out.append(
                f"| **{model} best** | 1 x {top['intra_op_threads']} | {top['batch_size']} "
                f"| **{top['inferences_per_s']:.0f}** | |"
            )
    out.append("")

    out.append("## 2. Transport limit: bare echo servers (tonic / hyper), FP32 [1,256]\n")
    out.append("| protocol | pinned | concurrency | infer/s | p50 (us) | p99 (us) | server CPU/request (us) | errors |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for pinned, table in (("yes", echo), ("no", echo_free)):
        for p in PROTOCOLS:
            for c in CONCURRENCIES:
                row = table[p].get(c)
                if row:
                    out.append(
                        f"| {PROTOCOL_NAMES[p]} | {pinned} | {c} | {row['throughput']:.0f} | {row['p50_us']} "
                        f"| {row['p99_us']} | {fmt_cpu(cpu(row))} | {row['errors']} |"
                    )
    out.append("")

    out.append("## 3. nereid-server, batch-1 requests\n")
    out.append(
        "| model | protocol | concurrency | infer/s | p50 (us) | p99 (us) | server CPU/request (us) | errors "
        "| infer/s vs echo | CPU vs echo | vs compute best |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in MODELS:
        # Identity is the transport's rival; the MLPs are read against the
        # compute limit here and against both limits in the targets.
        baseline = echo if m == "identity" else {}
        for p in PROTOCOLS:
            for c in CONCURRENCIES:
                row = server[(m, p)].get(c)
                if not row:
                    continue
                e = baseline.get(p, {}).get(c)
                vs_echo = row["throughput"] / e["throughput"] if e and e["throughput"] else None
                cpu_ratio = cpu(row) / cpu(e) if cpu(row) is not None and cpu(e) else None
                vs_compute = row["throughput"] / best[m] if m in best and best[m] else None
                out.append(
                    f"| {m} | {PROTOCOL_NAMES[p]} | {c} | {row['throughput']:.0f} | {row['p50_us']} | {row['p99_us']} "
                    f"| {fmt_cpu(cpu(row))} | {row['errors']} | {fmt_ratio(vs_echo)} | {fmt_ratio(cpu_ratio)} "
                    f"| {fmt_ratio(vs_compute)} |"
                )
    out.append("")

    profiles = {p: results / f"profile-{p}.txt" for p in PROTOCOLS}
    if any(f.exists() for f in profiles.values()):
        out.append("## Profile: nereid-server on identity, c=32, pinned\n")
        out.append(
            "`perf record -e cpu-clock` on the server for 5 s of the load; frames with 1 % of the samples or "
            "more, self time, kernel frames marked [k]. Samples with no symbol are left out.\n"
        )
        for p, f in profiles.items():
            if not f.exists():
                continue
            objects = results / f"profile-{p}-objects.txt"
            shares = []
            if objects.exists():
                for line in objects.read_text().splitlines():
                    share, _, name = line.strip().partition(" ")
                    shares.append(f"{name.strip()} {share}")
            out.append(f"{PROTOCOL_NAMES[p]} ({', '.join(shares) or 'no per-object split'}):\n")
            out.append("| self | object | frame |")
            out.append("|---:|---|---|")
            for line in f.read_text().splitlines():
                m = PROFILE_LINE.match(line)
                if not m or m["frame"].startswith("0x"):
                    continue
                frame = m["frame"].replace("|", "\\|")[:110]
                out.append(f"| {m['share']} | {m['object']} | `[{m['kind']}] {frame}` |")
            out.append("")

    out.append("## Targets\n")
    sweep = Round(echo, echo_free, server, best)
    rounds = load_rounds(results) or [sweep]
    if rounds[0] is sweep:
        source = "sections 1-3 above, as one round"
    else:
        count = f"{len(rounds)} rounds" if len(rounds) > 1 else "one round"
        source = f"section 5's {count}, each ratio read within its round"
    out.append(
        f"The rows with a round each come from {source}; a goal is read on the median. The rows after them "
        "come from sections 1-3.\n"
    )
    out.append("| target | median | each round | goal | |")
    out.append("|---|---:|---|---:|---|")

    def row_of(label: str, values: list[tuple[float, str]], goal: str, ok, unit: str = "") -> None:
        if not values:
            return
        mid = statistics.median(v for v, _ in values)
        shown = f"{mid:.0f}{unit}" if unit else f"{mid:.2f}"
        out.append(f"| {label} | {shown} | {' · '.join(d for _, d in values)} | {goal} | {verdict(ok(mid)) if ok else ''} |")

    for p in PROTOCOLS:
        values, throughput = [], []
        for r in rounds:
            row, e = r.server[("identity", p)].get(32), r.echo[p].get(32)
            if cpu(row) is not None and cpu(e):
                values.append((cpu(row) / cpu(e), f"{cpu(row) / cpu(e):.2f} ({fmt_cpu(cpu(row))}/{fmt_cpu(cpu(e))} us)"))
            if row and e and e["throughput"]:
                throughput.append((row["throughput"] / e["throughput"], f"{row['throughput'] / e['throughput']:.2f}"))
        row_of(f"identity {PROTOCOL_NAMES[p]} c32, server CPU/request / echo's", values, "<= 1.25", lambda v: v <= 1.25)
        row_of(f"identity {PROTOCOL_NAMES[p]} c32, throughput / echo's", throughput, "(report)", None)
    for p in PROTOCOLS:
        values = []
        for r in rounds:
            row, e = r.server[("identity", p)].get(1), r.echo[p].get(1)
            if row and e:
                added = row["p50_us"] - e["p50_us"]
                values.append((added, f"{added:+d} ({row['p50_us']}-{e['p50_us']})"))
        row_of(f"identity {PROTOCOL_NAMES[p]} c1, p50 over echo's (us)", values, "<= 15 us", lambda v: v <= 15, " us")
    for p in PROTOCOLS:
        values = []
        for r in rounds:
            large = r.server[("mlp_large", p)].get(64)
            if large and r.best.get("mlp_large"):
                ratio = large["throughput"] / r.best["mlp_large"]
                values.append((ratio, f"{ratio:.2f} ({large['throughput']:.0f}/{r.best['mlp_large']:.0f})"))
        row_of(f"mlp_large {PROTOCOL_NAMES[p]} c64 / in-process best", values, ">= 0.85", lambda v: v >= 0.85)
    for p in PROTOCOLS:
        values = []
        for r in rounds:
            small, e = r.server[("mlp_small", p)].get(64), r.echo_free[p].get(64)
            if small and e and e["throughput"] and r.best.get("mlp_small"):
                limit = 1 / (1 / e["throughput"] + 1 / r.best["mlp_small"])
                ratio = small["throughput"] / limit
                values.append((ratio, f"{ratio:.2f} ({small['throughput']:.0f}/{limit:.0f})"))
        row_of(
            f"mlp_small {PROTOCOL_NAMES[p]} c64 / combined limit 1/(1/echo + 1/compute best)",
            values,
            ">= 0.80",
            lambda v: v >= 0.8,
        )
    for p in PROTOCOLS:
        row, e = server[("mlp_small", p)].get(1), echo[p].get(1)
        if row and e and "mlp_small" in batch1_p50:
            budget = e["p50_us"] + batch1_p50["mlp_small"] + 50
            out.append(
                f"| mlp_small {PROTOCOL_NAMES[p]} c1 p50 (us) | {row['p50_us']} | | <= {budget:.0f} "
                f"(echo {e['p50_us']} + compute {batch1_p50['mlp_small']:.0f} + 50) | {verdict(row['p50_us'] <= budget)} |"
            )
    for m in MODELS:
        for p in PROTOCOLS:
            row = server[(m, p)].get(64)
            if row:
                out.append(f"| {m} {PROTOCOL_NAMES[p]} c64 p99 (us) | {row['p99_us']} | | (report) | |")
    idle_file = results / "server-idle-rss-kib.txt"
    if idle_file.exists():
        rss_mib = int(idle_file.read_text().strip()) / 1024
        out.append(f"| server RSS, idle, examples/models loaded | {rss_mib:.0f} MiB | | < 100 MiB | {verdict(rss_mib < 100)} |")
    rss_file = results / "server-rss-kib.txt"
    if rss_file.exists():
        rss_mib = int(rss_file.read_text().strip()) / 1024
        out.append(f"| server RSS, idle, examples/models + bench/models (96 MiB of mlp_large weights) | {rss_mib:.0f} MiB | | (report) | |")
    out.append("")
    return "\n".join(out)


BEGIN = "<!-- bench/run.sh writes from here -->"
END = "<!-- bench/run.sh writes up to here -->"


def write(path: Path, body: str) -> None:
    """Replaces the part between the markers; the hand-written rest stays."""
    block = f"{BEGIN}\n{body}\n{END}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Benchmarks\n\n{block}\n")
        return
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} has no '{BEGIN}' ... '{END}' markers; not overwriting it")
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    path.write_text(before + block + after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--write", type=Path, help="also write the report into this markdown file, between its markers")
    args = parser.parse_args()
    body = build(args.results)
    print(body)
    if args.write:
        write(args.write, body)


if __name__ == "__main__":
    main()
