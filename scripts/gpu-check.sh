#!/usr/bin/env bash
# Issue 43's device check: one prepared script for a GPU test machine (an
# H100 or H200 with the CUDA driver, PyTorch, numpy, nvidia-ml-py and
# cuda-bindings installed, no package registry).
#
#   scripts/gpu-check.sh --bundle    here: build the release server and stage
#                                    what the device machine lacks in
#                                    target/gpu-check (carry that path)
#   scripts/gpu-check.sh             on the device machine, from the bundle
#   scripts/gpu-check.sh --dry-run   any machine without a GPU: every step
#                                    that needs no device, the rest skipped
#                                    with the reason
#
# On the device it first runs nereid-gpu's tests (discovery; a batch staged
# in pinned memory, copied to the device and read back). Then it
# starts nereid-server on loopback with scripts/gpu-check/models, runs
# scripts/gpu-check/check.py against it (placement, GPU metrics against
# nvidia-smi, torch on the GPU through dynamic batching, CUDA shared memory
# with tritonclient, throughput against in-process torch), stops the
# server it started and writes the report to $OUT (target/gpu-check/out
# when unset). Sized for the device limits: about 2 minutes of checks,
# bounded at 90 s for the load and 300 s for the checks; the bundle is
# about 46 MB of the 64 MiB carried (the binary 22 MB, ml_dtypes 24 MB).
#
# NEREID_SERVER_BIN picks another server binary (the tests' dry run uses
# dist/bin/nereid-server).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bundle="$repo/target/gpu-check"
mode=device
case "${1:-}" in
    --bundle) mode=bundle ;;
    --dry-run) mode=dry-run ;;
    "") ;;
    *) echo "usage: $0 [--bundle | --dry-run]" >&2; exit 2 ;;
esac

if [ "$mode" = bundle ]; then
    (cd "$repo" && cargo build --release -p nereid-server)
    # nereid-gpu's own tests, which touch the device where there is one
    # (discovery, staging a batch there and reading it back).
    unit=$(cd "$repo" && cargo test --release -p nereid-gpu --lib --no-run --message-format=json 2>/dev/null \
        | "$repo/.venv/bin/python" -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "nereid_gpu":
        print(m["executable"])')
    rm -rf "$bundle" && mkdir -p "$bundle/site" "$bundle/wheels"
    cp "$repo/target/release/nereid-server" "$bundle/"
    cp "$unit" "$bundle/nereid-gpu-tests"
    python="$repo/.venv/bin/python"
    # tritonclient's CUDA shared memory helpers are pure Python (they need
    # cuda-bindings and numpy, which the device machine has, and ml_dtypes,
    # which it may not: its wheels for every CPython the machine could run).
    site=$("$python" -c 'import tritonclient, os; print(os.path.dirname(os.path.dirname(tritonclient.__file__)))')
    cp -r "$site/tritonclient" "$bundle/site/"
    find "$bundle/site" -name __pycache__ -prune -exec rm -rf {} +
    for version in 3.10 3.11 3.12 3.13 3.14; do
        "$python" -m pip download -q --only-binary=:all: --no-deps --python-version "$version" \
            --platform manylinux_2_27_x86_64 -d "$bundle/wheels" 'ml_dtypes==0.5.4'
    done
    du -sh "$bundle"
    exit 0
fi

OUT=${OUT:-$bundle/out}
mkdir -p "$OUT"
server_bin=${NEREID_SERVER_BIN:-$bundle/nereid-server}
if [ ! -x "$server_bin" ]; then
    echo "no server binary at $server_bin: run '$0 --bundle' first (or set NEREID_SERVER_BIN)" >&2
    exit 2
fi
# The checkout's environment where there is one (the dry run here); the
# machine's python3 on a device machine.
if [ -x "$repo/.venv/bin/python" ]; then
    export PATH="$repo/.venv/bin:$PATH"
fi
python=python3

# What the bundle carries, importable without installing anything.
site=$(mktemp -d)
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$site"
}
trap cleanup EXIT
if [ -d "$bundle/site" ]; then
    cp -r "$bundle/site/." "$site/"
fi
if ! "$python" -c 'import ml_dtypes' 2>/dev/null && [ -d "$bundle/wheels" ]; then
    "$python" - "$bundle/wheels" "$site" <<'PY'
import glob, sys, zipfile
tag = "cp%d%d" % sys.version_info[:2]
for wheel in glob.glob(f"{sys.argv[1]}/ml_dtypes-*-{tag}-*.whl"):
    zipfile.ZipFile(wheel).extractall(sys.argv[2])
PY
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

ports=$("$python" - <<'PY'
import socket
sockets = [socket.socket() for _ in range(3)]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in sockets))
PY
)
read -r http_port grpc_port metrics_port <<<"$ports"

{
    echo "mode: $mode"
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    "$python" -c 'import sys; print("python:", sys.version.split()[0])'
    "$python" -c 'import torch; print("torch:", torch.__version__, "cuda:", torch.version.cuda)' 2>/dev/null || echo "torch: absent"
    nvidia-smi -L 2>/dev/null || echo "nvidia-smi: absent"
} >"$OUT/environment.txt"

# The models' configs are complete: without auto-complete no stub imports
# a model before its placement is decided (torch is absent in a dry run).
"$server_bin" --model-repository "$repo/scripts/gpu-check/models" --disable-auto-complete-config \
    --http-address 127.0.0.1 --http-port "$http_port" \
    --grpc-address 127.0.0.1 --grpc-port "$grpc_port" \
    --metrics-address 127.0.0.1 --metrics-port "$metrics_port" \
    --allow-gpu-metrics true --metrics-interval-ms 500 \
    >"$OUT/server.log" 2>&1 &
server_pid=$!

http="http://127.0.0.1:$http_port"
# Loaded (or failed) within 90 s: torch's import and CUDA's first context
# take seconds.
"$python" - "$http" <<'PY'
import json, sys, time, urllib.request
deadline = time.monotonic() + 90
while time.monotonic() < deadline:
    try:
        request = urllib.request.Request(sys.argv[1] + "/v2/repository/index", data=b"{}", method="POST")
        rows = json.load(urllib.request.urlopen(request, timeout=5))
        if rows and all(r.get("state") in ("READY", "UNAVAILABLE") for r in rows):
            print(json.dumps(rows))
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit("the server did not load its models within 90 s")
PY

dry=()
[ "$mode" = dry-run ] && dry=(--dry-run)
unit=()
if [ "$mode" = device ] && [ -x "$bundle/nereid-gpu-tests" ]; then
    unit_status=0
    timeout 120 "$bundle/nereid-gpu-tests" --nocapture >"$OUT/gpu-unit.txt" 2>&1 || unit_status=$?
    unit=(--unit-tests "$OUT/gpu-unit.txt" --unit-status "$unit_status")
fi
status=0
timeout 300 "$python" "$repo/scripts/gpu-check/check.py" --http "$http" \
    --metrics "http://127.0.0.1:$metrics_port" --report "$OUT/gpu-check.json" "${dry[@]}" "${unit[@]}" \
    | tee "$OUT/check.txt" || status=$?
echo "report: $OUT/gpu-check.json (exit $status)"
exit "$status"
