#!/usr/bin/env bash
# An ensemble in the server against the same three models called one after
# another by the client, in one run on one machine (loopback only; every
# process started here is stopped by PID):
#
#   identity -> mlp_small -> identity, FP32 [1,256] batch-1 requests over
#   gRPC, closed loop at concurrency 1, 8 and 32: throughput, p50 and p99 of
#   the ensemble (one call per request) and of the chain (three calls).
#
# The server runs on core 0 and the client on core 1 when there are two
# cores or more, so the two do not take each other's time. A benchmark, not
# a test: nothing here fails on a timing. Results go to
# bench/results/ensemble/ and the table to stdout.
#
#   bench/ensemble.sh [--quick]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"

duration=4000
if [ "${1:-}" = "--quick" ]; then duration=1000; fi

cargo build --release --locked -p nereid-server -p nereid-bench
bin="$repo/target/release"
out="$repo/bench/results/ensemble"
rm -rf "$out" && mkdir -p "$out"
models="$out/models"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

identity() { # identity NAME
    mkdir -p "$models/$1/1"
    cat >"$models/$1/config.pbtxt" <<EOF
name: "$1"
backend: "identity"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
EOF
}
identity pre
identity post
cp -r examples/models/mlp_small "$models/mlp_small"
mkdir -p "$models/pipeline/1"
cat >"$models/pipeline/config.pbtxt" <<'EOF'
name: "pipeline"
platform: "ensemble"
max_batch_size: 64
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 256 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1 input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "a" } },
  { model_name: "mlp_small" model_version: -1 input_map { key: "INPUT0" value: "a" } output_map { key: "OUTPUT0" value: "b" } },
  { model_name: "post" model_version: -1 input_map { key: "INPUT0" value: "b" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
EOF

server_cpu=() client_cpu=()
if [ "$(nproc)" -ge 2 ]; then server_cpu=(taskset -c 0); client_cpu=(taskset -c 1); fi

"${server_cpu[@]}" "$bin/nereid-server" --model-repository "$models" \
    --http-address 127.0.0.1 --http-port 18300 --grpc-address 127.0.0.1 --grpc-port 18301 \
    --metrics-address 127.0.0.1 --metrics-port 18302 >"$out/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do
    grep -q "Started GRPCInferenceService" "$out/server.log" 2>/dev/null && break
    sleep 0.1
done
grep -q "Started GRPCInferenceService" "$out/server.log" || { cat "$out/server.log" >&2; exit 1; }

echo "== ensemble (pre -> mlp_small -> post in the server) against the chain (three client calls)"
"${client_cpu[@]}" "$bin/nereid-chain" -u 127.0.0.1:18301 --ensemble pipeline --steps pre,mlp_small,post \
    --concurrency-list 1,8,32 --duration-ms "$duration" --json "$out/chain.json"

"$repo/.venv/bin/python" - "$out/chain.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
by = {(r["mode"], r["concurrency"]): r for r in rows}
print("\n| concurrency | ensemble req/s | chain req/s | ratio | ensemble p50 µs | chain p50 µs | ensemble p99 µs | chain p99 µs |")
print("|---|---|---|---|---|---|---|---|")
for c in sorted({r["concurrency"] for r in rows}):
    e, k = by[("ensemble", c)], by[("chain", c)]
    print(f"| {c} | {e['throughput']:.0f} | {k['throughput']:.0f} | {e['throughput'] / k['throughput']:.2f}x "
          f"| {e['p50_us']} | {k['p50_us']} | {e['p99_us']} | {k['p99_us']} |")
EOF
