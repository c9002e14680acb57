#!/usr/bin/env bash
# Runs Triton's own python_backend examples, unchanged, against nereid-server:
# for each example, the shell lines of its README (mkdir, cp) lay out the
# model repository exactly as Triton's README says, nereid-server serves it
# on Triton's default ports (8000, 8001, 8002, loopback only: the clients
# hard-code localhost), and each client program the README names must exit 0.
#
#   scripts/triton-python-examples.sh PYTHON_BACKEND_CHECKOUT [EXAMPLE...]
#
# PYTHON_BACKEND_CHECKOUT: a clone of github.com/triton-inference-server/python_backend
# (not vendored here: its code is Triton's). Examples default to those that need
# nothing beyond numpy: add_sub auto_complete decoupled bls_decoupled custom_metrics;
# bls also needs torch for its "pytorch" model.
#
# Environment: NEREID_SERVER_BIN (default target/release/nereid-server, else
# target/debug), PYTHON (default .venv/bin/python: tritonclient and numpy).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHECKOUT="$(cd "${1:?usage: $0 PYTHON_BACKEND_CHECKOUT [EXAMPLE...]}" && pwd)"
shift
EXAMPLES=("$@")
[ ${#EXAMPLES[@]} -gt 0 ] || EXAMPLES=(add_sub auto_complete decoupled bls_decoupled custom_metrics)
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
SERVER="${NEREID_SERVER_BIN:-}"
if [ -z "$SERVER" ]; then
  SERVER="$ROOT/target/release/nereid-server"
  [ -x "$SERVER" ] || SERVER="$ROOT/target/debug/nereid-server"
fi
# The models' interpreter and the clients': python3 is the one beside $PYTHON
# (a virtual environment's bin folder).
export PATH="$(dirname "$PYTHON"):$PATH"

WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# The README's fenced shell lines that start with a command.
readme_lines() { # README PATTERN
  awk '/^```/{inside=!inside; next} inside' "$1" | grep -E "^($2)" || true
}

failed=0
for example in "${EXAMPLES[@]}"; do
  readme="$CHECKOUT/examples/$example/README.md"
  # add_sub has no README: the top-level one sets it up, in prose.
  [ -f "$readme" ] || [ "$example" = add_sub ] || { echo "no $readme" >&2; exit 2; }
  [ -f "$readme" ] || readme=/dev/null
  # Every model the example's README sets up, in one repository.
  dir="$WORK/$example"
  mkdir -p "$dir"
  ln -s "$CHECKOUT/examples" "$dir/examples"
  (cd "$dir" && readme_lines "$readme" 'mkdir |cp ' | bash -e)
  if [ "$example" = add_sub ]; then
    # The top-level README's steps.
    mkdir -p "$dir/models/add_sub/1"
    cp "$CHECKOUT/examples/add_sub/model.py" "$dir/models/add_sub/1/model.py"
    cp "$CHECKOUT/examples/add_sub/config.pbtxt" "$dir/models/add_sub/config.pbtxt"
  fi
  log="$WORK/$example.log"
  "$SERVER" --model-repository "$dir/models" --http-address 127.0.0.1 --grpc-address 127.0.0.1 \
    --http-port 8000 --grpc-port 8001 --metrics-port 8002 >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 300); do
    curl -sf -o /dev/null http://127.0.0.1:8000/v2/health/ready && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  clients="$(readme_lines "$readme" 'python3? ' | grep client || true)"
  [ "$example" = add_sub ] && clients="python3 examples/add_sub/client.py"
  while read -r client; do
    [ -n "$client" ] || continue
    if (cd "$dir" && timeout 120 $client >"$WORK/client.out" 2>&1); then
      echo "PASS $example: $client"
    else
      echo "FAIL $example: $client" >&2
      tail -20 "$WORK/client.out" >&2
      tail -20 "$log" >&2
      failed=1
    fi
  done <<<"$clients"
  kill "$SERVER_PID" && wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
done
exit $failed
