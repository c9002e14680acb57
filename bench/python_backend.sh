#!/usr/bin/env bash
# The Python backend against Triton's: the same model.py files (add_sub, as
# Triton's example configures it, and an identity with dynamic batching)
# served by nereid-server and by Triton 2.51 (PyPI's nvidia-pytriton 0.7.0
# ships tritonserver with its Python backend). Both run at once; each level
# (concurrency 1, 8 and 32, nereid-perf over gRPC) is measured on one server
# then the other, for a few rounds: this VM drifts by tens of per cent from
# one minute to the next, so servers measured minutes apart would not be
# comparable. Prints the medians side by side: throughput, p50, and each
# server's CPU per request with its stub processes included (nereid-perf
# reads the server's whole process tree around each window).
#
#   bench/python_backend.sh [--protocol grpc|http] [--interval MS] [--rounds N]
#
# Both servers run the models on one interpreter: a virtual environment of
# Debian's /usr/bin/python3 (Triton's stub links Debian's libpython3.11)
# with numpy 1.x (Triton 2.51's pb_utils does not run on numpy 2), named by
# each model's EXECUTION_ENV_PATH. Set up once under $NEREID_BENCH_CACHE
# (default ~/.cache/nereid-bench). A benchmark, not a test: nothing fails
# on a timing. Loopback only; stops what it starts, by PID.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

protocol=grpc interval=1500 rounds=3
while [ $# -gt 0 ]; do
    case $1 in
        --protocol) protocol=$2; shift 2 ;;
        --interval) interval=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        *) echo "usage: bench/python_backend.sh [--protocol grpc|http] [--interval MS] [--rounds N]" >&2; exit 2 ;;
    esac
done

cache=${NEREID_BENCH_CACHE:-$HOME/.cache/nereid-bench}
mkdir -p "$cache"
triton_venv=$cache/pytriton-0.7.0
model_env=$cache/python-model-env
if [ ! -x "$triton_venv/bin/python" ]; then
    python3 -m venv "$triton_venv"
    "$triton_venv/bin/pip" install -q nvidia-pytriton==0.7.0
fi
if [ ! -x "$model_env/bin/python3" ]; then
    /usr/bin/python3 -m venv "$model_env"
    "$model_env/bin/pip" install -q "numpy<2"
fi
site=$("$triton_venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
tritonserver=$site/pytriton/tritonserver/bin/tritonserver
triton_libs=$site/nvidia_pytriton.libs
python_minor=$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

cd "$repo"
cargo build --release -q -p nereid-server -p nereid-bench
bin=$repo/target/release

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# One repository for both: the examples, each naming the shared interpreter.
mkdir -p "$work/models"
for model in add_sub identity_fp32; do
    cp -r "examples/python_models/$model" "$work/models/"
    printf 'parameters [ { key: "EXECUTION_ENV_PATH" value: { string_value: "%s" } } ]\n' "$model_env" \
        >>"$work/models/$model/config.pbtxt"
done
# Triton's Python backend folder, as PyTriton lays it out.
mkdir -p "$work/backends/python"
cp "$site/pytriton/tritonserver/backends/python/"*.so "$site/pytriton/tritonserver/backends/python/"*.py \
    "$work/backends/python/"
cp "$site/pytriton/tritonserver/python_backend_stubs/$python_minor/triton_python_backend_stub" "$work/backends/python/"

declare -A server_pid port
# serve NAME BASE: starts one server on loopback ports BASE, BASE+1 (gRPC), BASE+2.
serve() {
    local http=$2 grpc=$(($2 + 1)) metrics=$(($2 + 2))
    case $1 in
        nereid)
            "$bin/nereid-server" --model-repository "$work/models" --http-address 127.0.0.1 --http-port "$http" \
                --grpc-address 127.0.0.1 --grpc-port "$grpc" --metrics-port "$metrics" >"$work/$1.log" 2>&1 &
            ;;
        triton)
            LD_LIBRARY_PATH=$triton_libs "$tritonserver" --model-repository "$work/models" \
                --backend-directory "$work/backends" --http-address 127.0.0.1 --http-port "$http" \
                --grpc-address 127.0.0.1 --grpc-port "$grpc" --metrics-port "$metrics" >"$work/$1.log" 2>&1 &
            ;;
    esac
    pids+=($!)
    server_pid[$1]=$!
    port[$1]=$http
    [ "$protocol" = grpc ] && port[$1]=$grpc
    for _ in $(seq 1 600); do
        if curl -sf "http://127.0.0.1:$http/v2/models/add_sub/ready" >/dev/null &&
            curl -sf "http://127.0.0.1:$http/v2/models/identity_fp32/ready" >/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "$1 did not get its models ready:" >&2
    tail -30 "$work/$1.log" >&2
    exit 1
}
serve nereid 18100
serve triton 18200

results=$work/results.csv
echo "round,server,model,concurrency,throughput,p50_us,errors,cpu_us_per_request" >"$results"
for round in $(seq 1 "$rounds"); do
    for model in add_sub identity_fp32; do
        shape=()
        [ "$model" = identity_fp32 ] && shape=(--shape INPUT0:1,256)
        for c in 1 8 32; do
            for server in nereid triton; do
                "$bin/nereid-perf" --protocol "$protocol" -u "127.0.0.1:${port[$server]}" -m "$model" "${shape[@]}" \
                    --server-pid "${server_pid[$server]}" --concurrency-list "$c" \
                    --measurement-interval "$interval" --csv "$work/level.csv" >/dev/null
                # protocol,mode,concurrency,request_rate,throughput,p50_us,p90,p95,p99,avg,errors,
                # late,stable,first_error,server_cpu_us_per_request
                row=$(tail -1 "$work/level.csv")
                IFS=, read -r -a f <<<"$row"
                echo "$round,$server,$model,$c,${f[4]},${f[5]},${f[10]},${f[-1]}" >>"$results"
            done
        done
    done
done
[ -z "${NEREID_BENCH_RESULTS:-}" ] || cp "$results" "$NEREID_BENCH_RESULTS"

python3 - "$results" <<'REPORT'
import csv, statistics, sys

rows = list(csv.DictReader(open(sys.argv[1])))

def values(server, model, c, field):
    return [
        float(r[field])
        for r in rows
        if (r["server"], r["model"], r["concurrency"]) == (server, model, c) and r[field] not in ("", "-")
    ]

def median(server, model, c, field):
    found = values(server, model, c, field)
    return statistics.median(found) if found else float("nan")

print(f"medians over {len({r['round'] for r in rows})} rounds")
print(
    f"{'model':<14}{'c':>4}{'nereid req/s':>14}{'triton req/s':>14}{'ratio':>7}"
    f"{'nereid p50':>12}{'triton p50':>12}{'nereid CPU':>12}{'triton CPU':>12}{'errors':>8}"
)
for model in ("add_sub", "identity_fp32"):
    for c in ("1", "8", "32"):
        n, t = median("nereid", model, c, "throughput"), median("triton", model, c, "throughput")
        errors = sum(values("nereid", model, c, "errors") + values("triton", model, c, "errors"))
        print(
            f"{model:<14}{c:>4}{n:>14.0f}{t:>14.0f}{n / t:>7.2f}"
            f"{median('nereid', model, c, 'p50_us'):>10.0f}us{median('triton', model, c, 'p50_us'):>10.0f}us"
            f"{median('nereid', model, c, 'cpu_us_per_request'):>10.0f}us"
            f"{median('triton', model, c, 'cpu_us_per_request'):>10.0f}us{errors:>8.0f}"
        )
print("CPU: per request answered, the server with its stub processes.")
REPORT
