"""Reads bench/run.sh's results and prints the targets, the tables and the ratios.

    .venv/bin/python bench/report.py bench/results [--write docs/benchmarks.md]

With --write, two parts of the file are replaced, each between its own pair
of markers: the "Targets and current figures" table, where only the rows
whose command is bench/run.sh are rewritten and every other row (the
gateway's, the ensembles', VAD's, ..., measured by other scripts) is kept as
written, and the generated sections (the header, sections 1-3, the profile).
The hand-written rest of the file survives a new run.
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
    """bench/run.sh's target rounds (its last step): files named roundN-..., one Round per N."""
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


# The command column of the targets table. The rows bench/run.sh owns start
# with RUN_SH; write() keeps every other row as the file has it.
RUN_SH = "`bench/run.sh`"
ROUNDS_COMMAND = f"{RUN_SH} (target rounds)"
SWEEP_COMMAND = f"{RUN_SH} (single sweep)"


@dataclass
class Report:
    """What one run writes: the targets table's bench/run.sh part, and the sections."""

    targets: str
    sections: str


def build(results: Path) -> Report:
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
    today = datetime.date.today().isoformat()

    out.append(
        f"Measured by `bench/run.sh` on {today} at commit `{commit}`: "
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

    sections = "\n".join(out)

    # The targets, for the first page's table: one row each, the command last.
    out = []
    sweep = Round(echo, echo_free, server, best)
    rounds = load_rounds(results) or [sweep]
    if rounds[0] is sweep:
        rounds_command = SWEEP_COMMAND
        source = "No target rounds were measured, so every row comes from the single sweep (sections 1-3 below)."
    else:
        rounds_command = ROUNDS_COMMAND
        count = f"{len(rounds)} alternating rounds" if len(rounds) > 1 else "one round"
        source = (
            f"A row marked target rounds gives the median of {count}, then each round's figure: each round "
            "measures both sides of every ratio within a minute or two, and the target is read on the median. "
            "A row marked single sweep comes from sections 1-3 below."
        )
    out.append(f"The {RUN_SH} rows are its run of {today} at commit `{commit}`. {source}\n")
    out.append("| what is measured | target | current figure | holds | command |")
    out.append("|---|---|---|---|---|")

    def target_row(label: str, goal: str, figure: str, holds: str, command: str) -> None:
        out.append(f"| {label} | {goal} | {figure} | {holds} | {command} |")

    def row_of(label: str, values: list[tuple[float, str]], goal: str, ok, unit: str = "") -> None:
        if not values:
            return
        mid = statistics.median(v for v, _ in values)
        shown = f"{mid:.0f}{unit}" if unit else f"{mid:.2f}"
        each = "rounds" if len(values) > 1 else "round"
        figure = f"{shown}; {each}: {' · '.join(d for _, d in values)}"
        target_row(label, goal, figure, verdict(ok(mid)) if ok else "", rounds_command)

    for p in PROTOCOLS:
        values, throughput = [], []
        for r in rounds:
            row, e = r.server[("identity", p)].get(32), r.echo[p].get(32)
            if cpu(row) is not None and cpu(e):
                values.append((cpu(row) / cpu(e), f"{cpu(row) / cpu(e):.2f} ({fmt_cpu(cpu(row))}/{fmt_cpu(cpu(e))} us)"))
            if row and e and e["throughput"]:
                throughput.append((row["throughput"] / e["throughput"], f"{row['throughput'] / e['throughput']:.2f}"))
        row_of(f"identity {PROTOCOL_NAMES[p]} c32, server CPU/request / echo's", values, "<= 1.25", lambda v: v <= 1.25)
        row_of(f"identity {PROTOCOL_NAMES[p]} c32, throughput / echo's", throughput, "(reported)", None)
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
            target_row(
                f"mlp_small {PROTOCOL_NAMES[p]} c1 p50 (us)",
                f"<= {budget:.0f} (echo {e['p50_us']} + compute {batch1_p50['mlp_small']:.0f} + 50)",
                str(row["p50_us"]),
                verdict(row["p50_us"] <= budget),
                SWEEP_COMMAND,
            )
    for m in MODELS:
        for p in PROTOCOLS:
            row = server[(m, p)].get(64)
            if row:
                target_row(f"{m} {PROTOCOL_NAMES[p]} c64 p99 (us)", "(reported)", str(row["p99_us"]), "", SWEEP_COMMAND)
    idle_file = results / "server-idle-rss-kib.txt"
    if idle_file.exists():
        rss_mib = int(idle_file.read_text().strip()) / 1024
        target_row(
            "server RSS, idle, examples/models loaded", "< 100 MiB", f"{rss_mib:.0f} MiB", verdict(rss_mib < 100), SWEEP_COMMAND
        )
    rss_file = results / "server-rss-kib.txt"
    if rss_file.exists():
        rss_mib = int(rss_file.read_text().strip()) / 1024
        target_row(
            "server RSS, idle, examples/models + bench/models (96 MiB of mlp_large weights)",
            "(reported)",
            f"{rss_mib:.0f} MiB",
            "",
            SWEEP_COMMAND,
        )
    return Report(targets="\n".join(out), sections=sections)


BEGIN = "<!-- bench/run.sh writes from here -->"
END = "<!-- bench/run.sh writes up to here -->"
TARGETS_BEGIN = "<!-- bench/run.sh writes the targets table from here -->"
TARGETS_END = "<!-- bench/run.sh writes the targets table up to here -->"


def between(text: str, begin: str, end: str) -> tuple[str, str, str]:
    """The text before `begin`, between the markers, and after `end`."""
    before, rest = text.split(begin, 1)
    inside, after = rest.split(end, 1)
    return before, inside, after


def command_of(row: str) -> str:
    """A table row's last cell (its command); `\\|` inside a cell is not a border."""
    return re.split(r"(?<!\\)\|", row.strip().strip("|"))[-1].strip()


def kept_rows(old_table: str) -> list[str]:
    """The rows of the old targets table that bench/run.sh does not own."""
    rows = [line for line in old_table.splitlines() if line.startswith("|")]
    return [row for row in rows[2:] if not command_of(row).startswith(RUN_SH)]


def write(path: Path, report: Report) -> None:
    """Replaces the two generated parts; the hand-written rest stays."""
    sections = f"{BEGIN}\n{report.sections}\n{END}"
    if not path.exists():
        targets = f"{TARGETS_BEGIN}\n{report.targets}\n\n{TARGETS_END}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Benchmarks\n\n## Targets and current figures\n\n{targets}\n\n{sections}\n")
        return
    text = path.read_text()
    for begin, end in ((TARGETS_BEGIN, TARGETS_END), (BEGIN, END)):
        if begin not in text or end not in text:
            raise SystemExit(f"{path} has no '{begin}' ... '{end}' markers; not overwriting it")
    before, old_table, after = between(text, TARGETS_BEGIN, TARGETS_END)
    table = "\n".join([report.targets, *kept_rows(old_table)])
    text = f"{before}{TARGETS_BEGIN}\n{table}\n\n{TARGETS_END}{after}"
    before, _, after = between(text, BEGIN, END)
    path.write_text(before + sections + after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--write", type=Path, help="also write the report into this markdown file, between its markers")
    args = parser.parse_args()
    report = build(args.results)
    print(report.targets)
    print()
    print(report.sections)
    if args.write:
        write(args.write, report)


if __name__ == "__main__":
    main()
