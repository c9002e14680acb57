#!/usr/bin/env bash
# Server binaries side by side with the bare echo server, in one run: for
# measuring one change to the request path against the machine's noise.
#
#   bench/ab.sh [--protocol http|grpc] [--rounds N] [--model M] [--concurrency LIST]
#               [--width W] [--one-connection] [--unpinned] BINARY...
#
# Each round starts the echo server, then each BINARY in turn (on
# examples/models), pinned to core 0 with nereid-perf on core 1, and measures
# the model (identity unless --model says, FP32[1,W] INPUT0, W 256 unless
# --width says; --one-connection: every worker on one HTTP/2 connection) at
# concurrency 1 and 32 (or --concurrency): throughput, p50 and the server's
# CPU per request (from /proc). --unpinned runs both on every core, as
# bench/run.sh runs the MLPs (ONNX Runtime wants both). Alternating the binaries within a
# round, over several rounds, separates a change from the VM's drift, which
# here moves every figure by 5-10 % within minutes. Build the binaries first
# (for example: copy target/release/nereid-server aside before and after a
# change). A benchmark, not a test: nothing fails on a timing. Talks to
# 127.0.0.1 only; stops what it starts, by PID.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

protocol=http rounds=1 interval=1500 model=identity concurrency=1,32 width=256 connections=()
server_cpu=(taskset -c 0) perf_cpu=(taskset -c 1)
while [ $# -gt 0 ]; do
    case $1 in
        --protocol) protocol=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --concurrency) concurrency=$2; shift 2 ;;
        --width) width=$2; shift 2 ;;
        --one-connection) connections=(--one-connection); shift ;;
        --unpinned) server_cpu=() perf_cpu=(); shift ;;
        *) break ;;
    esac
done
if [ $# -eq 0 ]; then
    echo "usage: bench/ab.sh [--protocol http|grpc] [--rounds N] [--model M] [--concurrency LIST] [--width W] [--one-connection] [--unpinned] BINARY..." >&2
    exit 2
fi
source "$repo/scripts/setup.sh"
cd "$repo"
bin="$repo/target/release"
log=$(mktemp -d)

pid=
cleanup() {
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$log"
}
trap cleanup EXIT

source "$repo/bench/serve.sh"

# measure NAME ADDRESS MODEL [flags]: one line per concurrency level.
measure() {
    local name=$1 address=$2 model=$3; shift 3
    "${perf_cpu[@]}" "$bin/nereid-perf" --protocol "$protocol" -u "$address" -m "$model" --server-pid "$pid" \
        --shape "INPUT0:1,$width" "${connections[@]}" --concurrency-list "$concurrency" --measurement-interval "$interval" "$@" 2>&1 \
        | grep -E '^ +c=[0-9]+:' | sed "s|^|$name |"
}

stop() { kill -TERM "$pid"; wait "$pid" || true; pid=; }

for round in $(seq 1 "$rounds"); do
    echo "== round $round ($protocol)"
    "${server_cpu[@]}" "$bin/nereid-echo" --address 127.0.0.1 --http-port 0 --grpc-port 0 --input "INPUT0:FP32:-1,$width" \
        >"$log/echo.log" 2>&1 &
    pid=$!
    line=$(wait_for_line "$log/echo.log" "listening")
    address=$(sed -E "s/.*$protocol=([^ ]+).*/\1/" <<<"$line")
    measure echo "$address" echo --datatype INPUT0:FP32
    stop
    for server in "$@"; do
        "${server_cpu[@]}" "$server" --model-repository examples/models "${local_ports[@]}" >"$log/server.log" 2>&1 &
        pid=$!
        server_addresses "$log/server.log"
        if [ "$protocol" = grpc ]; then address=$grpc; else address=$http; fi
        sleep 1
        measure "$server" "$address" "$model"
        stop
    done
done
