#!/usr/bin/env bash
# The crate boundaries the dependency graph must prove: nereid-core is
# transport-free (no HTTP or gRPC stack), and neither ONNX Runtime nor
# object storage reaches it; those live in the front ends and in their own
# crates (nereid-onnxruntime, nereid-remote, nereid-object-storage).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
forbidden='^(axum|hyper|hyper-util|tonic|h2|ort|object_store|opentelemetry-otlp) '
found=$(cargo tree --locked -p nereid-core -e normal --prefix none | grep -E "$forbidden" | sort -u || true)
if [ -n "$found" ]; then
    echo "nereid-core depends on crates that belong in a front end or a backend crate:" >&2
    echo "$found" >&2
    exit 1
fi
echo "nereid-core: none of axum, hyper, tonic, h2, ort, object_store, opentelemetry-otlp"
