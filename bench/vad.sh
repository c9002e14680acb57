#!/usr/bin/env bash
# Silero VAD as a stateful model in the server against the same model run
# directly, in one run on one machine (loopback only; every process started
# here is stopped by PID):
#
#   256 audio streams (by default), each one sequence sending a 32 ms chunk
#   of 16 kHz audio every 32 ms, as microphones deliver it; the server keeps
#   each stream's LSTM state and audio context and batches the chunks of all
#   streams. Reported: the server's CPU time per second of audio, against
#   ONNX Runtime running the model in-process stream by stream (batch 1) and
#   all streams per step (batch 256), and whether the server kept up.
#
# The server runs on core 0 and the load generator (and the baselines, after
# the load) on core 1 when there are two cores or more. A benchmark, not a
# test: nothing here fails on a timing. Results go to bench/results/vad/.
#
#   bench/vad.sh [--quick] [--streams N]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"

seconds=20 baseline=60 streams=256
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) seconds=5 baseline=15 ;;
        --streams) streams=$2; shift ;;
        *) echo "usage: bench/vad.sh [--quick] [--streams N]" >&2; exit 2 ;;
    esac
    shift
done

cargo build --release --locked -p nereid-server -p nereid-bench
bin="$repo/target/release"
out="$repo/bench/results/vad"
rm -rf "$out" && mkdir -p "$out"
models="$out/models"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# One instance on one thread, batches of up to all the streams.
"$repo/.venv/bin/python" examples/silero_vad_model.py "$models" --max-batch-size "$streams" >/dev/null
shipped=$("$repo/.venv/bin/python" -c 'import sys; sys.path.insert(0, "examples"); import silero_vad_model as m; print(m.shipped_model())')

server_cpu=() client_cpu=()
if [ "$(nproc)" -ge 2 ]; then server_cpu=(taskset -c 0); client_cpu=(taskset -c 1); fi

"${server_cpu[@]}" "$bin/nereid-server" --model-repository "$models" \
    --http-address 127.0.0.1 --http-port 18310 --grpc-address 127.0.0.1 --grpc-port 18311 \
    --metrics-address 127.0.0.1 --metrics-port 18312 >"$out/server.log" 2>&1 &
server=$!
pids+=("$server")
for _ in $(seq 1 600); do
    grep -q "Started GRPCInferenceService" "$out/server.log" 2>/dev/null && break
    sleep 0.1
done
grep -q "Started GRPCInferenceService" "$out/server.log" || { cat "$out/server.log" >&2; exit 1; }

echo "== $streams VAD streams at real time, $seconds s of audio each"
"${client_cpu[@]}" "$bin/nereid-vad" -u 127.0.0.1:18311 --server-pid "$server" --streams "$streams" \
    --seconds "$seconds" --baseline-seconds "$baseline" --direct-model "$shipped" \
    --json "$out/vad.json"
curl -s "http://127.0.0.1:18310/v2/models/silero_vad/stats" >"$out/stats.json"
"$repo/.venv/bin/python" - "$out/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["model_stats"][0]
n, e = int(s["inference_count"]), int(s["execution_count"])
print(f"server: {n} chunks in {e} executions ({n / max(e, 1):.1f} chunks per execution)")
PY
