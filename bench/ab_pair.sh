#!/usr/bin/env bash
# Two server binaries measured at the same time, for changes smaller than
# the machine's drift.
#
#   bench/ab_pair.sh [--model M] [--repository DIR]... [--protocol http|grpc]
#                    [--shape NAME:d1,d2] [-c N] [--rounds N] BINARY_A BINARY_B
#
# bench/ab.sh alternates binaries one after another; on this VM the same
# binary then reads up to 20 % apart from one minute to the next, which
# hides a change of a few per cent. Here both servers run at once, each
# loaded by its own nereid-perf at concurrency N for the same window, so a
# swing of the machine hits both alike and each round's ratio B/A is read
# within the round. Both get the same CPU time from the scheduler; the more
# efficient one answers more requests with it (docs/benchmarks-log.md,
# entry 20: the same binary against itself read 0.97-1.07 per round). A
# BINARY may be a wrapper script that execs nereid-server (to preload
# another allocator, set GLIBC_TUNABLES, ...). A benchmark, not a test:
# nothing fails on a timing. Talks to 127.0.0.1 only; stops what it starts,
# by PID.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

model=identity protocol=http shape=INPUT0:1,256 concurrency=32 rounds=6 interval=3000
repositories=()
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --repository) repositories+=("$2"); shift 2 ;;
        --protocol) protocol=$2; shift 2 ;;
        --shape) shape=$2; shift 2 ;;
        -c) concurrency=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        *) break ;;
    esac
done
if [ $# -ne 2 ]; then
    echo "usage: bench/ab_pair.sh [--model M] [--repository DIR]... [--protocol http|grpc] [--shape NAME:d1,d2] [-c N] [--rounds N] BINARY_A BINARY_B" >&2
    exit 2
fi
[ ${#repositories[@]} -gt 0 ] || repositories=("$repo/examples/models")
source "$repo/scripts/setup.sh"
cd "$repo"
bin="$repo/target/release"
log=$(mktemp -d)
source "$repo/bench/serve.sh"

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$log"
}
trap cleanup EXIT

repository_flags=()
for r in "${repositories[@]}"; do repository_flags+=(--model-repository "$r"); done

# start NAME BINARY: starts a server in the background (its PID kept for the clean-up).
start() {
    "$2" "${repository_flags[@]}" "${local_ports[@]}" >"$log/$1.log" 2>&1 &
    pids+=($!)
}

# address NAME: the server's address for the protocol, once its model is ready.
address() {
    server_addresses "$log/$1.log"
    for _ in $(seq 1 600); do
        if curl -sf "http://$http/v2/models/$model/ready" >/dev/null; then
            if [ "$protocol" = grpc ]; then echo "$grpc"; else echo "$http"; fi
            return 0
        fi
        sleep 0.1
    done
    echo "model '$model' did not become ready:" >&2
    cat "$log/$1.log" >&2
    return 1
}

start a "$1"
start b "$2"
address_a=$(address a)
address_b=$(address b)

# load NAME ADDRESS: nereid-perf's throughput over one window.
load() {
    "$bin/nereid-perf" --protocol "$protocol" -u "$2" -m "$model" --shape "$shape" \
        --concurrency-list "$concurrency" --measurement-interval "$interval" >"$log/$1.perf" 2>&1
}

ratios=()
for round in $(seq 1 "$rounds"); do
    load a "$address_a" & load_a=$!
    load b "$address_b" & load_b=$!
    wait "$load_a" "$load_b"
    a=$(grep -oE "c=$concurrency: [0-9.]+" "$log/a.perf" | awk '{print $2}')
    b=$(grep -oE "c=$concurrency: [0-9.]+" "$log/b.perf" | awk '{print $2}')
    if [ -z "$a" ] || [ -z "$b" ]; then cat "$log/a.perf" "$log/b.perf" >&2; exit 1; fi
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')
    ratios+=("$ratio")
    printf 'round %d: A %.0f/s  B %.0f/s  B/A %s\n' "$round" "$a" "$b" "$ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{r[NR] = $1} END {m = (NR % 2) ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2; printf "median B/A over %d rounds: %.3f\n", NR, m}'
