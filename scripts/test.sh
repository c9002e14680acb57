#!/usr/bin/env bash
# Sets up a fresh machine and runs every check and test: formatting, the
# crate boundaries (nereid-core's dependencies), clippy,
# the Rust unit, integration and end-to-end tests (one cargo invocation for
# the whole workspace; the e2e suite runs the operator and the Helm chart
# against a real Kubernetes control plane, all of it inside a network
# namespace of its own (e2e/netns.sh), and this script checks that the
# machine's own network is as it was afterwards), then the Python
# suite that drives the release server, staged by scripts/build.sh as the
# image's build stage stages it, with the real tritonclient over HTTP and
# gRPC, the Dockerfile's lint, and the image built from it and smoke-tested
# (scripts/image.sh).
#
# The control plane's binaries (kube-apiserver, etcd, KWOK, helm, ...) are
# built from their Go modules by e2e/tools.sh on the first run (about nine
# minutes on two cores from empty Go caches) and cached outside the
# repository for later runs.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"

# One build of the whole workspace gains nothing from incremental artifacts,
# which would otherwise take as much disk as the build itself (CI's disk is
# not large, and once ran out during clippy).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

echo "== e2e/tools.sh (the control plane's binaries, built once and cached)" >&2
NEREID_E2E_BIN=$("$repo/e2e/tools.sh")
export NEREID_E2E_BIN NEREID_E2E=required

echo "== cargo fmt --check" >&2
cargo fmt --all -- --check

echo "== crate boundaries (scripts/check-boundaries.sh)" >&2
"$repo/scripts/check-boundaries.sh"

echo "== cargo clippy" >&2
cargo clippy --locked --workspace --all-targets -- -D warnings

# What the machine's network is: interfaces, routes, network namespaces, iptables (counters aside).
host_network() {
    ip -o link show | cut -d: -f2
    ip route show table all
    ip netns list
    iptables-save | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//'
}
network_before=$(host_network)

echo "== cargo test" >&2
cargo test --locked --workspace

echo "== this machine's network, as before the tests" >&2
if ! diff <(echo "$network_before") <(host_network) >&2; then
    echo "the tests changed this machine's network (above: < before, > after)" >&2
    exit 1
fi

# The image's build stage is this same script, so what the image ships is what the Python suite tests.
echo "== scripts/build.sh (release binaries and the ONNX Runtime library, as in the image)" >&2
"$repo/scripts/build.sh" "$repo/dist"

echo "== pytest python/stub/tests (the Python backend's stub against a fake host)" >&2
"$repo/.venv/bin/python" -m pytest "$repo/python/stub/tests" -q -p no:cacheprovider

echo "== pytest (tritonclient against dist/bin/nereid-server)" >&2
NEREID_SERVER_BIN="$repo/dist/bin/nereid-server" ORT_DYLIB_PATH="$repo/dist/lib/libonnxruntime.so" \
    "$repo/.venv/bin/python" -m pytest "$repo/tests" -q

echo "== hadolint Dockerfile" >&2
"$repo/.venv/bin/hadolint" "$repo/Dockerfile"

# The image from that Dockerfile, built with buildah and run without a
# daemon (it reuses dist/ and, after the first run, the Debian base it made).
echo "== scripts/image.sh (the image: build, size, smoke test)" >&2
"$repo/scripts/image.sh"
