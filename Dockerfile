# syntax=docker/dockerfile:1
#
# The Nereid image. One image serves every binary:
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
# container.
#
#   docker build -t ghcr.io/nereid-dev/nereid:0.1.0 .
#   docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#       -v "$PWD/examples/models:/models:ro" ghcr.io/nereid-dev/nereid:0.1.0

FROM rust:1.95-bookworm AS build
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
# The caches keep crates, compiled dependencies and wheels between builds;
# build.sh copies what the image needs out of them into /out.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    --mount=type=cache,target=/root/.cache/pip \
    scripts/build.sh /out

FROM debian:bookworm-slim

# ca-certificates: object-storage fetches (S3, GCS, Azure) verify TLS against
# the system roots. Unpinned for the reason given in the build stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 65532 nereid \
    && useradd --no-log-init --uid 65532 --gid 65532 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin nereid \
    && mkdir /models

COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/lib/libonnxruntime.so /usr/local/lib/libonnxruntime.so
ENV ORT_DYLIB_PATH=/usr/local/lib/libonnxruntime.so

USER 65532:65532
# HTTP, gRPC, metrics.
EXPOSE 8000 8001 8002
ENTRYPOINT ["nereid-server"]
CMD ["--model-repository", "/models"]
