#!/usr/bin/env bash
# Builds the Nereid binaries (release) and stages them, with the ONNX Runtime
# library the server loads, into one folder:
#
#   OUT/bin/nereid-server    the inference server
#   OUT/bin/nereid-fetch     copies a model from object storage (init container)
#   OUT/bin/nereid-operator  the Kubernetes operator
#   OUT/bin/nereid-gateway   the cluster-wide inference endpoint
#   OUT/lib/libonnxruntime.so
#
# OUT is the first argument, dist/ in the repository by default. The
# Dockerfile's build stage is nothing but `scripts/build.sh /out`, and the
# Python environment and ONNX Runtime library come from scripts/setup.sh, the
# same as for the README's commands, so the image ships what CI tests.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Resolved before anything changes directory: a relative OUT is relative to
# the caller.
mkdir -p "${1:-$repo/dist}"
out=$(cd "${1:-$repo/dist}" && pwd)

# The Python environment in .venv and ORT_DYLIB_PATH, the ONNX Runtime
# library from its onnxruntime wheel.
# shellcheck source=scripts/setup.sh
source "$repo/scripts/setup.sh"

cd "$repo"
cargo build --release --locked -p nereid-server -p nereid-operator -p nereid-gateway --bins

target=${CARGO_TARGET_DIR:-target}
case $target in
    /*) ;;
    *) target="$repo/$target" ;;
esac

# The five files are overwritten in place; nothing else in OUT is touched,
# so OUT may be any folder (/out in the image build).
mkdir -p "$out/bin" "$out/lib"
for bin in nereid-server nereid-fetch nereid-operator nereid-gateway; do
    install -m 0755 "$target/release/$bin" "$out/bin/$bin"
done
# The wheel's file is versioned (libonnxruntime.so.1.x.y) and may be reached
# through a link: copy the file itself, under the plain name.
install -m 0644 "$(readlink -f "$ORT_DYLIB_PATH")" "$out/lib/libonnxruntime.so"

echo "build: staged $out/bin (nereid-server, nereid-fetch, nereid-operator, nereid-gateway) and $out/lib/libonnxruntime.so" >&2
