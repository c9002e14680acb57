#!/usr/bin/env bash
# The side-by-side benchmark, in one go on one machine:
#   1. compute limit:   each MLP in-process through ONNX Runtime, batch 1..64,
#                       with the server's thread settings;
#   2. transport limit: a bare tonic and a bare hyper echo server, driven by
#                       nereid-perf exactly as nereid-server is;
#   3. nereid-server:   identity, mlp_small and mlp_large (dynamic batching),
#                       batch-1 requests at concurrency 1, 8, 32, 64 over gRPC
#                       and HTTP binary.
# Results go to bench/results/ (JSON per run) and bench/report.py prints the
# table and ratios and writes docs/benchmarks.md. A benchmark, not a test:
# nothing here fails on a timing. Everything talks to 127.0.0.1 only and
# every process it starts is stopped by PID.
#
#   bench/run.sh [--quick]     (--quick: shorter windows, for a smoke run)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"

interval=2000
if [ "${1:-}" = "--quick" ]; then interval=500; fi

"$repo/.venv/bin/python" bench/generate_mlp_large.py
cargo build --release --locked -p nereid-server -p nereid-bench
bin="$repo/target/release"
out="$repo/bench/results"
rm -rf "$out" && mkdir -p "$out"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# Waits for "$1" (a log file) to contain "$2"; prints the matching line.
wait_for_line() {
    for _ in $(seq 1 600); do
        if grep -q "$2" "$1" 2>/dev/null; then grep -m1 "$2" "$1"; return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; return 1
}

cores=$(nproc)
perf() { # perf NAME PROTOCOL URL MODEL [extra flags]
    local name=$1 protocol=$2 url=$3 model=$4; shift 4
    "$bin/nereid-perf" --protocol "$protocol" -u "$url" -m "$model" \
        --concurrency-list 1,8,32,64 \
        --measurement-interval "$interval" --json "$out/$name.json" "$@" >"$out/$name.txt" 2>&1 \
        || { echo "nereid-perf failed for $name" >&2; cat "$out/$name.txt" >&2; return 1; }
    cat "$out/$name.txt"
}

echo "== 1. compute limit (in-process ONNX Runtime, $cores intra-op threads)"
for model in examples/models/mlp_small bench/models/mlp_large; do
    name=$(basename "$model")
    "$bin/nereid-compute-limit" --model "$model/1/model.onnx" --intra-op-threads "$cores" \
        --batch-sizes 1,2,4,8,16,32,64 --duration-ms "$interval" --json "$out/compute-$name.json"
done

echo "== 2. transport limit (bare tonic / hyper echo)"
"$bin/nereid-echo" --address 127.0.0.1 --http-port 0 --grpc-port 0 --input INPUT0:FP32:-1,256 >"$out/echo.log" 2>&1 &
pids+=($!)
line=$(wait_for_line "$out/echo.log" "listening")
echo_http=$(sed -E 's/.*http=([^ ]+).*/\1/' <<<"$line")
echo_grpc=$(sed -E 's/.*grpc=([^ ]+).*/\1/' <<<"$line")
perf echo-grpc grpc "$echo_grpc" echo --shape INPUT0:1,256 --datatype INPUT0:FP32
perf echo-http http "$echo_http" echo --shape INPUT0:1,256 --datatype INPUT0:FP32

echo "== 3. nereid-server"
# Idle memory with the default repository alone, as the README runs it.
"$bin/nereid-server" --model-repository examples/models \
    --http-address 127.0.0.1 --http-port 0 --grpc-address 127.0.0.1 --grpc-port 0 --metrics-port 0 >"$out/server-idle.log" 2>&1 &
idle_server=$!
pids+=($idle_server)
wait_for_line "$out/server-idle.log" "Started HTTPService" >/dev/null
sleep 1
grep VmRSS "/proc/$idle_server/status" | awk '{print $2}' >"$out/server-idle-rss-kib.txt"
kill -TERM "$idle_server"; wait "$idle_server" || true
echo "idle RSS, examples/models: $(cat "$out/server-idle-rss-kib.txt") KiB"

"$bin/nereid-server" --model-repository examples/models --model-repository bench/models \
    --http-address 127.0.0.1 --http-port 0 --grpc-address 127.0.0.1 --grpc-port 0 --metrics-port 0 >"$out/server.log" 2>&1 &
server=$!
pids+=($server)
http=$(wait_for_line "$out/server.log" "Started HTTPService" | sed -E 's/.*at ([0-9.:]+).*/\1/')
grpc=$(wait_for_line "$out/server.log" "Started GRPCInferenceService" | sed -E 's/.*at ([0-9.:]+).*/\1/')
sleep 1
grep VmRSS "/proc/$server/status" | awk '{print $2}' >"$out/server-rss-kib.txt"
echo "idle RSS, examples/models + bench/models: $(cat "$out/server-rss-kib.txt") KiB"
for model in identity mlp_small mlp_large; do
    for protocol in grpc http; do
        url=$([ "$protocol" = grpc ] && echo "$grpc" || echo "$http")
        perf "server-$model-$protocol" "$protocol" "$url" "$model" --shape INPUT0:1,$([ "$model" = mlp_large ] && echo 1024 || echo 256)
    done
done

"$repo/.venv/bin/python" bench/report.py "$out" --write docs/benchmarks.md
