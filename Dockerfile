# syntax=docker/dockerfile:1
#
# The Nereid image. One image serves every program, each a name linked to
# the one multicall binary /usr/local/bin/nereid (multicall/):
#
# - nereid-server, the entrypoint: serves the model repository in /models
#   (HTTP 8000, gRPC 8001, metrics 8002);
# - nereid-operator: the operator Deployment of charts/nereid runs this image
#   with `command: ["nereid-operator"]`;
# - nereid-fetch: the serving pods the operator creates run nereid-server from
#   this image, and their init container runs nereid-fetch from it to copy the
#   model out of object storage;
# - nereid-gateway: the gateway Deployment of charts/nereid runs it with
#   `command: ["nereid-gateway"]`.
#
# The build stage runs scripts/build.sh, the same recipe as outside a
# container. The last stage is FROM scratch: scripts/image-rootfs.sh gathers
# the binary, python3 with numpy (for Python models) and exactly the
# libraries they link into one root file system, so the image has no shell,
# no package manager and nothing that runs as root.
#
#   docker build -t ghcr.io/nereid-dev/nereid:0.1.0 \
#       --build-arg RUST_DIGEST=sha256:... --build-arg DEBIAN_DIGEST=sha256:... .
#   docker run --rm --read-only --tmpfs /tmp -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#       -v "$PWD/examples/models:/models:ro" ghcr.io/nereid-dev/nereid:0.1.0
#
# Base images are pulled by digest when RUST_DIGEST and DEBIAN_DIGEST are
# given: a tag can be pushed again (by the publisher or by whoever takes over
# the name), a digest names exactly one image. Release builds must give both;
# `docker buildx imagetools inspect rust:1.95-bookworm` (and
# debian:bookworm-slim) prints the digest of the image list to pin. Without
# them the tags alone are used, as before.
#
# Build arguments besides the base images:
# - BINARIES: `build` (the default) compiles the binaries in the build stage;
#   `staged` takes them from a build context named `dist`, a folder that
#   scripts/build.sh filled outside (`--build-context dist=dist`). Unused
#   stages are skipped, so the Rust image is needed only for `build`.
#   scripts/image.sh builds this way where no Rust image can be pulled.
# - ONNXRUNTIME: `onnxruntime` (CPU, the default) or `onnxruntime-gpu`: the
#   GPU variant ships that wheel's library, its CUDA execution provider and
#   the CUDA libraries it loads (the driver's libcuda.so.1
#   comes from the NVIDIA container runtime).
# - VERSION, REVISION, SOURCE: the OCI labels.

ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUST_DIGEST=
ARG DEBIAN_IMAGE=debian:bookworm-slim
ARG DEBIAN_DIGEST=

ARG BINARIES=build

FROM ${RUST_IMAGE}${RUST_DIGEST:+@${RUST_DIGEST}} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# scripts/setup.sh builds a Python virtual environment; its onnxruntime wheel
# provides the ONNX Runtime library the server loads. Debian replaces package
# versions with each stable update, so exact pins would break the build; the
# base image's tag fixes the release instead.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .
ARG ONNXRUNTIME=onnxruntime
# The caches keep crates, compiled dependencies and wheels between builds;
# build.sh copies what the image needs out of them into /out.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    --mount=type=cache,target=/root/.cache/pip \
    NEREID_ONNXRUNTIME=${ONNXRUNTIME} scripts/build.sh /out

# The same files, staged outside by scripts/build.sh; `dist` is a build
# context, not a stage.
FROM scratch AS staged
# hadolint ignore=DL3022
COPY --from=dist / /out/

# hadolint ignore=DL3006
FROM ${BINARIES} AS binaries

FROM ${DEBIAN_IMAGE}${DEBIAN_DIGEST:+@${DEBIAN_DIGEST}} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# ca-certificates: object-storage fetches (S3, GCS, Azure) verify TLS against
# the system roots. python3 and numpy: what Python models (backend "python")
# run on; a model may name another interpreter (EXECUTION_ENV_PATH).
# Unpinned for the reason given in the build stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-numpy \
    && rm -rf /var/lib/apt/lists/*

COPY --from=binaries /out/ /staged/
COPY scripts/image-rootfs.sh /usr/local/sbin/
RUN image-rootfs.sh /staged /rootfs

FROM scratch
COPY --from=runtime /rootfs/ /
ENV PATH=/usr/local/bin:/usr/bin \
    ORT_DYLIB_PATH=/usr/local/lib/libonnxruntime.so

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/nereid-dev/nereid
LABEL org.opencontainers.image.title="nereid" \
      org.opencontainers.image.description="Triton-compatible inference server, Kubernetes operator and gateway" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"

USER 65532:65532
# HTTP, gRPC, metrics.
EXPOSE 8000 8001 8002
ENTRYPOINT ["nereid-server"]
CMD ["--model-repository", "/models"]
