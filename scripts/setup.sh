#!/usr/bin/env bash
# Prepares a fresh machine for building, running and testing Nereid. Sourced
# by run-server.sh and test.sh; safe to run again (each step is skipped when
# already done).
#
# - the Python environment in .venv (tests/requirements.txt): tritonclient,
#   pytest, onnx for the model generator, and onnxruntime, whose wheel carries
#   the ONNX Runtime shared library the server loads (ort's load-dynamic);
#   and, without their dependencies, the packages in
#   tests/requirements-no-deps.txt (the Silero VAD model);
# - the example ONNX models, generated if missing;
# - ORT_DYLIB_PATH, exported, pointing at that library.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv"

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not installed; install Rust 1.92 or newer (rustup) first" >&2
    exit 1
fi

python=${PYTHON:-python3}
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "setup: installing python3-venv" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi

# The e2e suite runs in network namespaces of its own (`unshare`, `ip netns`):
# its process nodes give each pod a namespace on a bridge, and kube-proxy
# writes its Services' rules with iptables (Debian's, on nf_tables).
for tool in ip:iproute2 iptables-save:iptables unshare:util-linux; do
    if ! command -v "${tool%%:*}" >/dev/null 2>&1; then
        echo "setup: installing ${tool#*:}" >&2
        apt-get update -qq && apt-get install -y -qq "${tool#*:}" >/dev/null
    fi
done

# The e2e autoscaling scenario calls the operator's external metrics API as
# kube-apiserver's front proxy would, with curl and the front-proxy certificate.
if ! command -v curl >/dev/null 2>&1; then
    echo "setup: installing curl" >&2
    apt-get update -qq && apt-get install -y -qq curl >/dev/null
fi

# Reinstall only when the requirements change.
stamp="$venv/.requirements.sha256"
want=$(cat "$repo/tests/requirements.txt" "$repo/tests/requirements-no-deps.txt" | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: creating the Python environment in .venv" >&2
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$repo/tests/requirements.txt"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$repo/tests/requirements-no-deps.txt"
    echo "$want" > "$stamp"
fi

"$venv/bin/python" "$repo/examples/generate_models.py" >/dev/null

capi=$("$venv/bin/python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))')
ORT_DYLIB_PATH=$(ls "$capi"/libonnxruntime.so.* | head -n 1)
export ORT_DYLIB_PATH
echo "setup: ONNX Runtime library $ORT_DYLIB_PATH" >&2
