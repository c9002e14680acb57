#!/usr/bin/env bash
# The side-by-side benchmark, in one go on one machine:
#   0. wake-up cost:    what one cross-core wake-up costs here (bench/wake_cost.py),
#                       which the batched figures pay several times per batch;
#   1. compute limit:   each MLP in-process through ONNX Runtime, batch 1..64,
#                       as one session on every core and as one single-
#                       threaded session per core side by side (the two
#                       layouts a served model's instances take);
#   2. transport limit: a bare tonic and a bare hyper echo server, driven by
#                       nereid-perf exactly as nereid-server is;
#   3. nereid-server:   identity, mlp_small and mlp_large (dynamic batching),
#                       batch-1 requests at concurrency 1, 8, 32, 64 over gRPC
#                       and HTTP binary;
#   4. profile:         where the server's CPU goes on identity at c=32, per
#                       protocol (perf record, user space), when perf can;
#   5. targets:         the points the targets read (identity c=1 and c=32
#                       against the echo, the MLPs at c=64 against their
#                       limits), again in three rounds that each measure both
#                       sides of every ratio, so drift between sections does
#                       not decide a target.
# Identity and the echo servers run pinned to core 0 with the load generator
# on core 1, so each side's CPU per request is its own; the MLPs and the echo
# baseline they are read against run unpinned, since ONNX Runtime needs both
# cores. nereid-perf reads the server's CPU time from /proc around every
# window (--server-pid), so each level also gives CPU per request.
#
# Results go to bench/results/ (JSON per run) and bench/report.py prints the
# targets, tables and ratios and rewrites its two parts of docs/benchmarks.md
# (its rows of the targets table, and the sections of this run; the other
# rows and the hand-written text stay). A benchmark, not a test: nothing here
# fails on a timing. Everything talks to 127.0.0.1 only and every process
# it starts is stopped by PID.
#
#   bench/run.sh [--quick]     (--quick: shorter windows and one round, for a smoke run)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"

interval=2000 rounds=3
if [ "${1:-}" = "--quick" ]; then interval=500 rounds=1; fi

"$repo/.venv/bin/python" bench/generate_mlp_large.py
cargo build --release --locked -p nereid-server -p nereid-bench
bin="$repo/target/release"
out="$repo/bench/results"
rm -rf "$out" && mkdir -p "$out"
git describe --always --dirty >"$out/commit.txt"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

source "$repo/bench/serve.sh"

cores=$(nproc)
server_core=() client_core=()
if [ "$cores" -ge 2 ] && command -v taskset >/dev/null; then
    server_core=(taskset -c 0) client_core=(taskset -c 1)
fi

# measure NAME PIN PROTOCOL URL MODEL PID [extra flags]; PIN is "pinned" or "free".
measure() {
    local name=$1 pin=$2 protocol=$3 url=$4 model=$5 pid=$6; shift 6
    local runner=()
    if [ "$pin" = pinned ]; then runner=("${client_core[@]}"); fi
    "${runner[@]}" "$bin/nereid-perf" --protocol "$protocol" -u "$url" -m "$model" --server-pid "$pid" \
        --measurement-interval "$interval" --json "$out/$name.json" "$@" >"$out/$name.txt" 2>&1 \
        || { echo "nereid-perf failed for $name" >&2; cat "$out/$name.txt" >&2; return 1; }
    cat "$out/$name.txt"
}
levels=(--concurrency-list 1,8,32,64)

# measure_both NAME PIN GRPC_URL HTTP_URL MODEL PID [extra flags]: measure
# over gRPC, then HTTP, as NAME-grpc and NAME-http.
measure_both() {
    local name=$1 pin=$2 grpc_url=$3 http_url=$4; shift 4
    measure "$name-grpc" "$pin" grpc "$grpc_url" "$@"
    measure "$name-http" "$pin" http "$http_url" "$@"
}

# shape MODEL: the --shape of one request to MODEL.
shape() { if [ "$1" = mlp_large ]; then echo INPUT0:1,1024; else echo INPUT0:1,256; fi; }

# start_echo LOG PIN: starts nereid-echo, sets echo_pid, echo_http, echo_grpc.
start_echo() {
    local runner=()
    if [ "$2" = pinned ]; then runner=("${server_core[@]}"); fi
    "${runner[@]}" "$bin/nereid-echo" --address 127.0.0.1 --http-port 0 --grpc-port 0 --input INPUT0:FP32:-1,256 >"$1" 2>&1 &
    echo_pid=$!
    pids+=("$echo_pid")
    local line
    line=$(wait_for_line "$1" "listening")
    echo_http=$(sed -E 's/.*http=([^ ]+).*/\1/' <<<"$line")
    echo_grpc=$(sed -E 's/.*grpc=([^ ]+).*/\1/' <<<"$line")
}

# start_server LOG PIN REPOSITORY...: starts nereid-server, sets server_pid, http, grpc.
start_server() {
    local log=$1 pin=$2; shift 2
    local runner=() repos=()
    if [ "$pin" = pinned ]; then runner=("${server_core[@]}"); fi
    for r in "$@"; do repos+=(--model-repository "$r"); done
    "${runner[@]}" "$bin/nereid-server" "${repos[@]}" "${local_ports[@]}" >"$log" 2>&1 &
    server_pid=$!
    pids+=("$server_pid")
    server_addresses "$log"
    sleep 1
}

stop() { kill -TERM "$1"; wait "$1" || true; }

echo "== 0. wake-up cost (a pipe round trip between two processes, on one core and across two)"
"$repo/.venv/bin/python" bench/wake_cost.py "$out/wake-cost.json"

echo "== 1. compute limit (in-process ONNX Runtime: one session of $cores intra-op threads, $cores sessions of one)"
for model in examples/models/mlp_small bench/models/mlp_large; do
    name=$(basename "$model")
    "$bin/nereid-compute-limit" --model "$model/1/model.onnx" --intra-op-threads "$cores" \
        --batch-sizes 1,2,4,8,16,32,64 --duration-ms "$interval" --json "$out/compute-$name.json"
    if [ "$cores" -gt 1 ]; then
        "$bin/nereid-compute-limit" --model "$model/1/model.onnx" --sessions "$cores" --intra-op-threads 1 \
            --batch-sizes 8,16,32,64 --duration-ms "$interval" --json "$out/compute-$name-sessions.json"
    fi
done

echo "== 2. transport limit (bare tonic / hyper echo), pinned, then free for the MLPs' limit"
start_echo "$out/echo.log" pinned
measure_both echo pinned "$echo_grpc" "$echo_http" echo "$echo_pid" "${levels[@]}" --shape INPUT0:1,256 --datatype INPUT0:FP32
stop "$echo_pid"
start_echo "$out/echo-free.log" free
measure_both echo-free free "$echo_grpc" "$echo_http" echo "$echo_pid" --concurrency-list 64 \
    --shape INPUT0:1,256 --datatype INPUT0:FP32
stop "$echo_pid"

echo "== 3. nereid-server"
# Idle memory with the default repository alone, as the README runs it.
start_server "$out/server-idle.log" free examples/models
grep VmRSS "/proc/$server_pid/status" | awk '{print $2}' >"$out/server-idle-rss-kib.txt"
echo "idle RSS, examples/models: $(cat "$out/server-idle-rss-kib.txt") KiB"
stop "$server_pid"

start_server "$out/server-pinned.log" pinned examples/models
measure_both server-identity pinned "$grpc" "$http" identity "$server_pid" "${levels[@]}" --shape INPUT0:1,256

echo "== 4. profile: identity at c=32, server pinned"
if profiler=$(type -P perf) && "$profiler" record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1; then
    for protocol in grpc http; do
        url=$([ "$protocol" = grpc ] && echo "$grpc" || echo "$http")
        "${client_core[@]}" "$bin/nereid-perf" --protocol "$protocol" -u "$url" -m identity --shape INPUT0:1,256 \
            --concurrency-list 32 --measurement-interval 4000 --max-trials 3 >/dev/null 2>&1 &
        load=$!
        sleep 1
        "$profiler" record -q -e cpu-clock -F 999 -g -p "$server_pid" -o "$out/profile-$protocol.data" -- sleep 5 \
            >/dev/null 2>&1 || true
        wait "$load" || true
        "$profiler" report -i "$out/profile-$protocol.data" --no-children --sort dso,symbol --stdio -g none \
            --percent-limit 1 2>/dev/null | grep -E '^ +[0-9]' >"$out/profile-$protocol.txt" || true
        "$profiler" report -i "$out/profile-$protocol.data" --no-children --sort dso --stdio -g none \
            --percent-limit 1 2>/dev/null | grep -E '^ +[0-9]' >"$out/profile-$protocol-objects.txt" || true
        rm -f "$out/profile-$protocol.data"
        echo "$protocol: $(wc -l <"$out/profile-$protocol.txt") frames at 1 % or more"
    done
else
    echo "perf is not usable here; no profile"
fi
stop "$server_pid"

start_server "$out/server.log" free examples/models bench/models
grep VmRSS "/proc/$server_pid/status" | awk '{print $2}' >"$out/server-rss-kib.txt"
echo "idle RSS, examples/models + bench/models: $(cat "$out/server-rss-kib.txt") KiB"
for model in mlp_small mlp_large; do
    measure_both "server-$model" free "$grpc" "$http" "$model" "$server_pid" "${levels[@]}" --shape "$(shape "$model")"
done

stop "$server_pid"

# The targets, again in alternating rounds. On a shared VM every figure
# drifts 5-20 % within minutes, and sections 1-3 measure each baseline
# minutes before the server it is read against; here each round measures
# both sides of every target within a minute or two, and report.py reads
# each ratio inside its round and gives the median over the rounds.
echo "== 5. targets: $rounds alternating rounds"
for round in $(seq 1 "$rounds"); do
    echo "-- round $round"
    start_echo "$out/round$round-echo.log" pinned
    measure_both "round$round-echo" pinned "$echo_grpc" "$echo_http" echo "$echo_pid" --concurrency-list 1,32 \
        --shape INPUT0:1,256 --datatype INPUT0:FP32
    stop "$echo_pid"
    start_server "$out/round$round-server-pinned.log" pinned examples/models
    measure_both "round$round-server-identity" pinned "$grpc" "$http" identity "$server_pid" \
        --concurrency-list 1,32 --shape INPUT0:1,256
    stop "$server_pid"
    for model in examples/models/mlp_small bench/models/mlp_large; do
        "$bin/nereid-compute-limit" --model "$model/1/model.onnx" --intra-op-threads "$cores" --batch-sizes 32,64 \
            --duration-ms "$interval" --json "$out/round$round-compute-$(basename "$model").json"
    done
    start_echo "$out/round$round-echo-free.log" free
    measure_both "round$round-echo-free" free "$echo_grpc" "$echo_http" echo "$echo_pid" --concurrency-list 64 \
        --shape INPUT0:1,256 --datatype INPUT0:FP32
    stop "$echo_pid"
    start_server "$out/round$round-server.log" free examples/models bench/models
    for model in mlp_small mlp_large; do
        measure_both "round$round-server-$model" free "$grpc" "$http" "$model" "$server_pid" \
            --concurrency-list 64 --shape "$(shape "$model")"
    done
    stop "$server_pid"
done

"$repo/.venv/bin/python" bench/report.py "$out" --write docs/benchmarks.md
