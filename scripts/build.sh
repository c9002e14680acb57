#!/usr/bin/env bash
# Builds the Nereid binaries (release) and stages them, with the ONNX Runtime
# library the server loads, into one folder:
#
#   OUT/bin/nereid           the four programs in one binary (multicall/),
#   OUT/bin/nereid-server    and links to it by their names:
#   OUT/bin/nereid-fetch       the inference server; copies a model from
#   OUT/bin/nereid-operator    object storage (init container); the
#   OUT/bin/nereid-gateway     Kubernetes operator; the cluster-wide endpoint
#   OUT/lib/libonnxruntime.so
#
# NEREID_ONNXRUNTIME chooses that library: `onnxruntime` (the default) takes
# it from the onnxruntime wheel in .venv, the one the tests run on;
# `onnxruntime-gpu` takes it from the GPU wheel pinned in
# scripts/requirements-gpu.txt and stages beside it the wheel's CUDA
# execution provider (libonnxruntime_providers_cuda.so, with
# libonnxruntime_providers_shared.so) and the CUDA and cuDNN libraries
# they load, from NVIDIA's wheels (its `cuda` and `cudnn` extras), so the
# image's loader finds every one of them in /usr/local/lib. Those wheels are
# installed once into NEREID_GPU_WHEELS (default ~/.cache/nereid-gpu-wheels).
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
cargo build --release --locked -p nereid-multicall --bin nereid

target=${CARGO_TARGET_DIR:-target}
case $target in
    /*) ;;
    *) target="$repo/$target" ;;
esac

# The binaries are overwritten in place, and of lib/ only the files the
# last build staged (listed in OUT/lib/.staged) are removed first, so OUT may
# be any folder (/out in the image build) and a CPU build after a GPU one
# leaves no CUDA library behind.
mkdir -p "$out/bin" "$out/lib"
# Stripped of its symbol table (a fifth of its size; panics and errors still
# name what failed); profile the binaries in target/release instead.
install -m 0755 --strip "$target/release/nereid" "$out/bin/nereid"
for bin in nereid-server nereid-fetch nereid-operator nereid-gateway; do
    ln -sfn nereid "$out/bin/$bin"
done
if [ -f "$out/lib/.staged" ]; then
    while read -r name; do rm -f "$out/lib/$name"; done <"$out/lib/.staged"
fi
staged=()
stage_lib() { # FILE NAME
    install -m 0644 "$1" "$out/lib/$2"
    staged+=("$2")
}
case ${NEREID_ONNXRUNTIME:-onnxruntime} in
    onnxruntime)
        # The wheel's file is versioned (libonnxruntime.so.1.x.y) and may be
        # reached through a link: copy the file itself, under the plain name.
        stage_lib "$(readlink -f "$ORT_DYLIB_PATH")" libonnxruntime.so
        ;;
    onnxruntime-gpu)
        wheels=${NEREID_GPU_WHEELS:-$HOME/.cache/nereid-gpu-wheels}
        want=$(sha256sum <"$repo/scripts/requirements-gpu.txt" | cut -d' ' -f1)
        if [ "$(cat "$wheels/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
            echo "build: installing the GPU wheels into $wheels" >&2
            rm -rf "$wheels"
            "$repo/.venv/bin/pip" install --quiet --disable-pip-version-check --no-warn-conflicts --no-compile \
                --target "$wheels" -r "$repo/scripts/requirements-gpu.txt"
            echo "$want" >"$wheels/.requirements.sha256"
        fi
        stage_lib "$(ls "$wheels"/onnxruntime/capi/libonnxruntime.so.* | head -n 1)" libonnxruntime.so
        # The CUDA provider and the bridge every provider loads through; not
        # TensorRT's, whose libraries (libnvinfer) no pinned wheel provides.
        for lib in libonnxruntime_providers_shared.so libonnxruntime_providers_cuda.so; do
            stage_lib "$wheels/onnxruntime/capi/$lib" "$lib"
        done
        # NVIDIA's wheels name their libraries by soname (libcudart.so.13);
        # links among them are copied as the files they point at.
        for lib in "$wheels"/nvidia/*/lib/*.so*; do
            stage_lib "$(readlink -f "$lib")" "${lib##*/}"
        done
        ;;
    *)
        echo "build: NEREID_ONNXRUNTIME must be onnxruntime or onnxruntime-gpu, not '$NEREID_ONNXRUNTIME'" >&2
        exit 2
        ;;
esac

printf '%s\n' "${staged[@]}" >"$out/lib/.staged"
echo "build: staged $out/bin (nereid, linked as nereid-server, nereid-fetch, nereid-operator, nereid-gateway) and ${#staged[@]} files in $out/lib (${NEREID_ONNXRUNTIME:-onnxruntime})" >&2
