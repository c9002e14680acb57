#!/usr/bin/env bash
# Sets up a fresh machine and runs every check and test: formatting, clippy,
# the Rust unit and integration tests (one cargo invocation for the whole
# workspace), then the Python suite that drives the built server with the
# real tritonclient over HTTP and gRPC.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"

echo "== cargo fmt --check" >&2
cargo fmt --all -- --check

echo "== cargo clippy" >&2
cargo clippy --locked --workspace --all-targets -- -D warnings

echo "== cargo test" >&2
cargo test --locked --workspace

echo "== pytest (tritonclient against target/debug/nereid-server)" >&2
NEREID_SERVER_BIN="$repo/target/debug/nereid-server" "$repo/.venv/bin/python" -m pytest "$repo/tests" -q
