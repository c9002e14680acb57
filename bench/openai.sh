#!/usr/bin/env bash
# The OpenAI API's cost on time to first token: the test text generator
# (tests/python_models/text_generator, a Python-backend model with the
# inputs and outputs of Triton's vLLM backend) served by a release
# nereid-server, called through its own generate_stream, through the OpenAI
# API on the server, and through the OpenAI API on nereid-gateway, in one
# run (bench/openai.py). Issue 44's target: the OpenAI layer adds at most
# 5 % to time to first token at concurrency 32.
#
#   bench/openai.sh [bench/openai.py options]
#
# Needs the test environment (.venv with tokenizers and openai's httpx2: the
# README's test command makes it). A benchmark, not a test: nothing fails
# on a timing. Loopback only; stops what it starts, by PID.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
cargo build --release -q -p nereid-server -p nereid-gateway
bin=$repo/target/release

work=$(mktemp -d)
source "$repo/bench/processes.sh"
cleanup() {
    stop_started
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/models"
cp -r tests/python_models/text_generator "$work/models/"
PATH=$repo/.venv/bin:$PATH "$bin/nereid-server" --model-repository "$work/models" --http-address 127.0.0.1 \
    --http-port 18400 --grpc-address 127.0.0.1 --grpc-port 18401 --metrics-port 18402 >"$work/server.log" 2>&1 &
pids+=($!)
NO_COLOR=1 "$bin/nereid-gateway" --address 127.0.0.1 --http-port 18410 --grpc-port 18411 --metrics-port 18412 \
    --endpoint text_generator=127.0.0.1:18400,127.0.0.1:18401 >"$work/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do
    curl -sf http://127.0.0.1:18400/v2/models/text_generator/ready >/dev/null && break
    sleep 0.1
done
curl -sf http://127.0.0.1:18400/v2/models/text_generator/ready >/dev/null || {
    tail -30 "$work/server.log" >&2
    exit 1
}
"$repo/.venv/bin/python" bench/openai.py 127.0.0.1:18400 127.0.0.1:18410 text_generator "$@"
