#!/usr/bin/env bash
# Sets up a fresh machine, builds nereid-server (release) and runs it on the
# embedded example repository: HTTP on 8000, gRPC on 8001. Extra arguments
# are passed to the server (for example --http-port 9000).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"
cargo build --release --locked -p nereid-server
exec "$repo/target/release/nereid-server" --model-repository "$repo/examples/models" "$@"
