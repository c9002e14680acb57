#!/usr/bin/env bash
# What metrics and tracing cost, measured side by side in one run (see
# bench/observability.py); writes docs/observability.md. A benchmark, not a
# test. Everything talks to 127.0.0.1 only; every process started is stopped.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"
cargo build --release --locked -p nereid-server -p nereid-bench
exec "$repo/.venv/bin/python" bench/observability.py --bin "$repo/target/release" --write docs/observability.md "$@"
