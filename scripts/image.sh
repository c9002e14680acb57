#!/usr/bin/env bash
# Builds the Nereid image from the repository's Dockerfile with buildah,
# which needs no container engine daemon, then runs the image without one and
# checks that it serves.
#
#   scripts/image.sh            build, measure, smoke-test
#   scripts/image.sh build      build and measure only
#
# The Dockerfile is the one a user builds with docker elsewhere. Where its
# base images cannot be pulled (no registry reaches this machine), this
# script supplies them:
# - debian:bookworm-slim: made here with debootstrap (minbase, slimmed as
#   Debian's own slim image is) and tagged under that name, so the
#   Dockerfile's FROM finds it. It is kept in the cache below and made again
#   only when missing.
# - the Rust build stage: the binaries are built outside by scripts/build.sh
#   (the same recipe the build stage runs) and given to the build as the
#   context `dist`, with BINARIES=staged.
#
# The smoke test runs the image's own entrypoint, command, user and
# environment (read from its config) with the image's file system mounted
# read-only, tmpfs on /tmp and /dev/shm (a pod's emptyDirs), and the example
# models plus examples/python_models/add_sub bound read-only at /models: the real
# tritonclient infers over HTTP and gRPC on loopback, from an ONNX model and
# a Python model. It also checks the server and its Python stub run as 65532
# on a read-only root, and that the other binaries start from the image.
#
# Environment:
#   NEREID_IMAGE_VARIANT   cpu (default) or gpu (ONNXRUNTIME=onnxruntime-gpu)
#   NEREID_IMAGE           the tag (default localhost/nereid:VERSION[-gpu])
#   NEREID_IMAGE_CACHE     buildah's storage, with the base image
#                          (default ~/.cache/nereid-image); never required
#   NEREID_IMAGE_MAX_MB    the most the CPU image may take unpacked (150)
#   NEREID_DEBIAN_MIRROR   where debootstrap fetches Debian
#                          (default http://deb.debian.org/debian)
#
# It needs root (buildah's chroot isolation, and the smoke test's mounts).
# Without buildah and no way to install it, it says so in one line and
# exits 0: the image is not this machine's to build.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-all}
case $mode in all | build) ;; *) echo "usage: image.sh [build]" >&2 && exit 2 ;; esac

variant=${NEREID_IMAGE_VARIANT:-cpu}
case $variant in
    cpu) onnxruntime=onnxruntime suffix= ;;
    gpu) onnxruntime=onnxruntime-gpu suffix=-gpu ;;
    *) echo "image: NEREID_IMAGE_VARIANT must be cpu or gpu, not '$variant'" >&2 && exit 2 ;;
esac
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
image=${NEREID_IMAGE:-localhost/nereid:$version$suffix}
cache=${NEREID_IMAGE_CACHE:-$HOME/.cache/nereid-image}
mirror=${NEREID_DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=docker.io/library/debian:bookworm-slim

skip() {
    echo "image: skipped: $*" >&2
    exit 0
}

[ "$(id -u)" = 0 ] || skip "building and running the image here needs root (buildah's chroot isolation)"
for tool in buildah debootstrap; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        command -v apt-get >/dev/null 2>&1 || skip "$tool is missing and not installable (no apt-get)"
        echo "image: installing $tool" >&2
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$tool" >/dev/null; } ||
            skip "$tool is missing and apt-get could not install it"
    fi
done

# One storage of our own, so nothing depends on (or disturbs) the machine's.
bah() {
    buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs "$@"
}

work=$(mktemp -d)
cleanup() {
    [ -z "${server_pid:-}" ] || { kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null; } || true
    [ -z "${container:-}" ] || { bah umount "$container" && bah rm "$container"; } >/dev/null 2>&1 || true
    [ -z "${base_container:-}" ] || bah rm "$base_container" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# debian:bookworm-slim: pulled where a registry answers, made here otherwise.
make_base() {
    local rootfs=$work/debian
    echo "image: making $base with debootstrap from $mirror" >&2
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
        tail -n 20 "$work/debootstrap.log" >&2
        return 1
    }
    # What Debian's slim images leave out, and keep out of later installs.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    printf 'Acquire::Languages "none";\n' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
    # The suites Debian's image lists: the release, its updates and security.
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$rootfs"/usr/share/{man,info,locale,lintian,linda}/* \
        "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/tmp/*
    : >"$rootfs/etc/machine-id"

    base_container=$(bah from scratch)
    local mnt
    mnt=$(bah mount "$base_container")
    cp -a "$rootfs/." "$mnt/"
    bah umount "$base_container" >/dev/null
    bah config --cmd bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --label "org.opencontainers.image.description=Debian bookworm (debootstrap minbase, slimmed) made by scripts/image.sh" \
        "$base_container"
    bah commit --quiet --rm "$base_container" "$base" >/dev/null
    base_container=
    rm -rf "$rootfs"
}

# Containers a killed run left behind (the storage is this script's alone).
bah rm --all >/dev/null 2>&1 || true

started=$SECONDS
if bah inspect --type image "$base" >/dev/null 2>&1; then
    echo "image: $base from the cache ($cache)" >&2
elif bah pull --quiet --retry 0 "$base" >/dev/null 2>&1; then
    echo "image: pulled $base" >&2
else
    make_base
fi

# The binaries: the in-image build where the Rust image can be pulled,
# scripts/build.sh's staged files otherwise.
rust_image=rust:1.95-bookworm
build_args=(--build-arg "ONNXRUNTIME=$onnxruntime")
if bah inspect --type image "docker.io/library/$rust_image" >/dev/null 2>&1 ||
    bah pull --quiet --retry 0 "docker.io/library/$rust_image" >/dev/null 2>&1; then
    echo "image: binaries built in the image ($rust_image)" >&2
else
    dist=$repo/dist$suffix
    echo "image: $rust_image cannot be pulled; binaries staged by scripts/build.sh in $dist" >&2
    NEREID_ONNXRUNTIME=$onnxruntime "$repo/scripts/build.sh" "$dist"
    build_args+=(--build-arg BINARIES=staged --build-context "dist=$dist")
fi

revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
echo "image: building $image" >&2
bah bud --quiet --isolation chroot --pull=never --layers=false \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    "${build_args[@]}" -t "$image" -f "$repo/Dockerfile" "$repo" >/dev/null
built=$((SECONDS - started))
# The stages' images and containers (buildah 1.28 leaves the staged stage's
# working container behind), and the image this tag named before.
bah rm --all >/dev/null 2>&1 || true
bah rmi --prune >/dev/null 2>&1 || true

# Sizes: unpacked, the image's file system; compressed, its layers as an
# OCI archive (gzip), what a registry would store and a node download.
container=$(bah from --pull=never --quiet "$image")
rootfs=$(bah mount "$container")
unpacked=$(du -sb --apparent-size "$rootfs" | cut -f1)
bah push --quiet "$image" "oci-archive:$work/image.tar" >/dev/null
compressed=$(stat -c %s "$work/image.tar")
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
echo "image: $image built in ${built}s: $(mb "$unpacked") unpacked, $(mb "$compressed") compressed" >&2
if [ "$variant" = cpu ]; then
    max=${NEREID_IMAGE_MAX_MB:-150}
    if [ "$unpacked" -gt $((max * 1000000)) ]; then
        echo "image: the CPU image takes $(mb "$unpacked") unpacked, over its bound of $max MB" >&2
        exit 1
    fi
fi
[ "$mode" = all ] || exit 0

# The smoke test needs the test environment (tritonclient).
# shellcheck source=scripts/setup.sh
source "$repo/scripts/setup.sh" >/dev/null 2>&1
python=$repo/.venv/bin/python
bah inspect --type image "$image" | "$python" "$repo/tests/image/config.py" >"$work/config.env"
# IMAGE_USER, IMAGE_ENTRYPOINT (a bash array), IMAGE_ENV (an array)
# shellcheck source=/dev/null
source "$work/config.env"

# Runs COMMAND... from the image as a container runtime would: in a mount
# namespace of its own, the root read-only, /proc, a minimal /dev, tmpfs on
# /tmp and /dev/shm, each model folder bound read-only under /models, the
# image's user and environment and nothing else. It execs all the way down,
# so its PID is the program's: call it in a subshell (or with &).
run_in_image() {
    exec unshare --mount --propagation private -- bash -euo pipefail -c '
        root=$1 user=$2
        shift 2
        mount --bind "$root" "$root"
        mount -t proc proc "$root/proc"
        mount -t tmpfs -o mode=0755,size=1m tmpfs "$root/dev"
        for node in null zero random urandom; do
            : >"$root/dev/$node"
            mount --bind "/dev/$node" "$root/dev/$node"
        done
        mkdir "$root/dev/shm"
        mount -t tmpfs -o mode=1777,size=256m tmpfs "$root/dev/shm"
        mount -t tmpfs -o mode=1777,size=256m tmpfs "$root/tmp"
        mount -t tmpfs -o mode=0755,size=1m tmpfs "$root/models"
        while [ "$1" != -- ]; do
            mkdir "$root/models/${1##*/}"
            mount --bind "$1" "$root/models/${1##*/}"
            mount -o remount,bind,ro "$root/models/${1##*/}"
            shift
        done
        shift
        mount -o remount,ro "$root/models"
        mount -o remount,bind,ro "$root"
        env=()
        while [ "$1" != -- ]; do env+=("$1"); shift; done
        shift
        # The host'"'"'s chroot, found before PATH becomes the image'"'"'s.
        exec env -i "${env[@]}" "$(command -v chroot)" --userspec="$user" "$root" "$@"
    ' run_in_image "$rootfs" "$IMAGE_USER" "$repo"/examples/models/* "$repo"/examples/python_models/add_sub -- "${IMAGE_ENV[@]}" -- "$@"
}

# The other binaries start from the image.
for program in nereid-operator nereid-gateway nereid-fetch; do
    if ! (run_in_image "$program" --help) >"$work/help" 2>&1 || ! grep -q '^Usage:' "$work/help"; then
        echo "image: '$program --help' failed in the image:" >&2
        cat "$work/help" >&2
        exit 1
    fi
done

# The operator's init steps, as its pods run them: nereid-fetch alone, since
# the image has no shell (a claim's copy, and the ConfigMap's configs).
if ! (run_in_image nereid-fetch pvc://claim/simple /tmp/models/simple --from /models/simple) >"$work/init" 2>&1 ||
    ! (run_in_image nereid-fetch --write-configs /models/simple /tmp/models) >>"$work/init" 2>&1 ||
    ! grep -q 'copied pvc://claim/simple' "$work/init" ||
    ! grep -q 'wrote the configs of 1 model' "$work/init"; then
    echo "image: the operator's init steps failed in the image:" >&2
    cat "$work/init" >&2
    exit 1
fi

# The server, by the image's own entrypoint and command, on loopback ports.
read -r http grpc metrics < <("$python" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
')
run_in_image "${IMAGE_ENTRYPOINT[@]}" "${IMAGE_CMD[@]}" \
    --http-address 127.0.0.1 --http-port "$http" --grpc-address 127.0.0.1 --grpc-port "$grpc" \
    --metrics-address 127.0.0.1 --metrics-port "$metrics" >"$work/server.log" 2>&1 &
server_pid=$!
if ! "$python" "$repo/tests/image/smoke.py" --pid "$server_pid" --http "$http" --grpc "$grpc" --metrics "$metrics"; then
    echo "image: the smoke test failed; the server's log:" >&2
    tail -n 40 "$work/server.log" >&2
    exit 1
fi
kill "$server_pid"
wait "$server_pid" || true
server_pid=
echo "image: smoke test passed ($image, uid ${IMAGE_USER%%:*}, read-only root)" >&2
