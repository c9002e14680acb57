#!/usr/bin/env bash
# nereid-gateway against calling the pods directly, in one run on one
# machine (loopback only; every process started here is stopped by PID):
#
#   A. overhead: one identity pod (FP32[256]), gRPC at concurrency 1 and 32,
#      direct and through the gateway (its default worker threads, then
#      one): the p50 the gateway adds, and its CPU time per request (from
#      /proc, over requests the pod counted) against the server's, both the
#      server's behind the gateway (the same requests, but multiplexed on
#      one connection, which costs the server less) and the server's when
#      clients call it directly. Then a byte relay (nereid-relay) in front
#      of the same pod, costed the same way: the floor under any proxy here.
#   B. spread: three identity pods behind the gateway, every worker on ONE
#      gRPC connection (as one client application): each pod's share.
#   C. tail: three pods, one ten times slower (10 ms against 1 ms per
#      request): p99 at concurrency 32, least-loaded against round-robin.
#
# A benchmark, not a test: nothing here fails on a timing. Results go to
# bench/results/gateway/ and the summary to stdout.
#
#   bench/gateway.sh [--quick]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"

interval=3000
if [ "${1:-}" = "--quick" ]; then interval=1000; fi

cargo build --release --locked -p nereid-server -p nereid-gateway -p nereid-bench
bin="$repo/target/release"
out="$repo/bench/results/gateway"
rm -rf "$out" && mkdir -p "$out"

source "$repo/bench/processes.sh"
trap stop_started EXIT

source "$repo/bench/wait_for_line.sh"

# cpu_ticks PID: user + system time so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# pod NAME DELAY_MS PORT_BASE: an identity pod on PORT_BASE (HTTP), +1 (gRPC), +2 (metrics).
pod() {
    local name=$1 delay=$2 port=$3 repo_dir="$out/$1-models"
    mkdir -p "$repo_dir/identity/1"
    cat >"$repo_dir/identity/config.pbtxt" <<EOF
name: "identity"
backend: "identity"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "execute_delay_ms" value: { string_value: "$delay" } }
EOF
    "$bin/nereid-server" --model-repository "$repo_dir" \
        --http-address 127.0.0.1 --http-port "$port" \
        --grpc-address 127.0.0.1 --grpc-port "$((port + 1))" \
        --metrics-address 127.0.0.1 --metrics-port "$((port + 2))" >"$out/$name.log" 2>&1 &
    pids+=($!)
    wait_for_line "$out/$name.log" "Started GRPCInferenceService" >/dev/null
    last_pid=$!
}

# gateway NAME PICKER ENDPOINT... [-- FLAG...]: the gateway on 18200 (HTTP) / 18201 (gRPC).
gateway() {
    local name=$1 picker=$2; shift 2
    local flags=()
    while [ $# -gt 0 ]; do
        if [ "$1" = "--" ]; then shift; flags+=("$@"); break; fi
        flags+=(--endpoint "identity=$1"); shift
    done
    "$bin/nereid-gateway" --address 127.0.0.1 --http-port 18200 --grpc-port 18201 --metrics-port 18202 \
        --picker "$picker" "${flags[@]}" >"$out/$name.log" 2>&1 &
    pids+=($!)
    wait_for_line "$out/$name.log" "nereid-gateway listening" >/dev/null
    last_pid=$!
}

# perf NAME URL CONCURRENCY [flags]: identity FP32[256] over gRPC.
perf() {
    local name=$1 url=$2 concurrency=$3; shift 3
    "$bin/nereid-perf" --protocol grpc -u "$url" -m identity --shape INPUT0:256 --datatype INPUT0:FP32 \
        --concurrency-list "$concurrency" --measurement-interval "$interval" \
        --json "$out/$name.json" "$@" >"$out/$name.txt" 2>&1 \
        || { echo "nereid-perf failed for $name" >&2; cat "$out/$name.txt" >&2; return 1; }
}

summary() { # summary NAME: "infer/s p50 p99" of a perf run
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))[0]
print("%.0f %d %d" % (r["throughput"], r["p50_us"], r["p99_us"]))' "$out/$1.json"
}

echo "== A. overhead: one pod, direct and through the gateway"
# inferences PORT: how many the pod on PORT (HTTP) has answered.
inferences() {
    curl -s "http://127.0.0.1:$1/v2/models/identity/stats" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])'
}
pod a-pod 0 18100; server_pid=$last_pid
# The gateway with its default worker threads (one per CPU), then with one.
for threads in default 1; do
    flags=(); label=""
    if [ "$threads" = 1 ]; then flags=(-- --worker-threads 1); label=", one worker thread"; fi
    gateway "a-gateway-$threads" least-loaded 127.0.0.1:18100,127.0.0.1:18101 "${flags[@]}"; gateway_pid=$last_pid
    for c in 1 32; do
        n0=$(inferences 18100); s0=$(cpu_ticks "$server_pid")
        perf "a-direct-$threads-c$c" 127.0.0.1:18101 "$c"
        n1=$(inferences 18100); s1=$(cpu_ticks "$server_pid"); g1=$(cpu_ticks "$gateway_pid")
        perf "a-gateway-$threads-c$c" 127.0.0.1:18201 "$c"
        n2=$(inferences 18100); s2=$(cpu_ticks "$server_pid"); g2=$(cpu_ticks "$gateway_pid")
        read -r direct_rate direct_p50 direct_p99 <<<"$(summary "a-direct-$threads-c$c")"
        read -r gw_rate gw_p50 gw_p99 <<<"$(summary "a-gateway-$threads-c$c")"
        python3 - "$c$label" "$direct_rate" "$direct_p50" "$direct_p99" "$gw_rate" "$gw_p50" "$gw_p99" \
            "$((n1 - n0))" "$((s1 - s0))" "$((n2 - n1))" "$((s2 - s1))" "$((g2 - g1))" "$(getconf CLK_TCK)" \
            <<'EOF' | tee -a "$out/summary.txt"
import sys
c, dr, dp50, dp99, gr, gp50, gp99, n_direct, s_direct, n_gw, s_gw, g_gw, hz = sys.argv[1:]
# CPU per request over each whole run (warm-up and every window), the
# requests counted by the pod itself.
def per_request(ticks, requests):
    return int(ticks) / int(hz) * 1e6 / max(int(requests), 1)
server_direct = per_request(s_direct, n_direct)
server_behind = per_request(s_gw, n_gw)
gateway = per_request(g_gw, n_gw)
print(f"c={c}: direct {float(dr):.0f} infer/s p50 {dp50} us p99 {dp99} us | "
      f"gateway {float(gr):.0f} infer/s p50 {gp50} us p99 {gp99} us | added p50 {int(gp50) - int(dp50)} us | "
      f"CPU per request: gateway {gateway:.0f} us, server {server_behind:.0f} us behind it, "
      f"{server_direct:.0f} us direct | gateway / server, same requests {gateway / server_behind:.2f}; "
      f"/ server direct {gateway / server_direct:.2f}")
EOF
    done
    stop "$gateway_pid"
done
# The floor under any proxy: a byte relay (one upstream connection per client
# connection, nothing parsed) in front of the same pod, costed the same way.
"$bin/nereid-relay" --listen 127.0.0.1:18203 --upstream 127.0.0.1:18101 >"$out/a-relay.log" 2>&1 &
pids+=($!); relay_pid=$!
wait_for_line "$out/a-relay.log" "listening" >/dev/null
for c in 1 32; do
    n0=$(inferences 18100); s0=$(cpu_ticks "$server_pid"); r0=$(cpu_ticks "$relay_pid")
    perf "a-relay-c$c" 127.0.0.1:18203 "$c"
    n1=$(inferences 18100); s1=$(cpu_ticks "$server_pid"); r1=$(cpu_ticks "$relay_pid")
    read -r relay_rate relay_p50 relay_p99 <<<"$(summary "a-relay-c$c")"
    read -r direct_rate direct_p50 direct_p99 <<<"$(summary "a-direct-default-c$c")"
    python3 - "$c" "$relay_rate" "$relay_p50" "$relay_p99" "$direct_p50" \
        "$((n1 - n0))" "$((s1 - s0))" "$((r1 - r0))" "$(getconf CLK_TCK)" <<'EOF2' | tee -a "$out/summary.txt"
import sys
c, rr, rp50, rp99, dp50, n, s, r, hz = sys.argv[1:]
server = int(s) / int(hz) * 1e6 / max(int(n), 1)
relay = int(r) / int(hz) * 1e6 / max(int(n), 1)
print(f"c={c}: byte relay {float(rr):.0f} infer/s p50 {rp50} us p99 {rp99} us | added p50 {int(rp50) - int(dp50)} us "
      f"(against the first direct run) | CPU per request: relay {relay:.0f} us, server {server:.0f} us behind it | "
      f"relay / server {relay / server:.2f}")
EOF2
done
stop "$relay_pid"
stop "$server_pid"; pids=()

echo "== B. spread: three pods, one gRPC connection, concurrency 32"
pod b-pod0 0 18110; pod b-pod1 0 18120; pod b-pod2 0 18130
gateway b-gateway least-loaded 127.0.0.1:18110,127.0.0.1:18111 127.0.0.1:18120,127.0.0.1:18121 \
    127.0.0.1:18130,127.0.0.1:18131
perf b-spread 127.0.0.1:18201 32 --one-connection
counts=()
for port in 18110 18120 18130; do
    counts+=("$(curl -s "http://127.0.0.1:$port/v2/models/identity/stats" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])')")
done
python3 - "${counts[@]}" <<'EOF' | tee -a "$out/summary.txt"
import sys
counts = [int(c) for c in sys.argv[1:]]
total = sum(counts)
shares = [c / total * 3 for c in counts]
print(f"spread: per-pod requests {counts}; each pod's share of a third: "
      + ", ".join(f"{s:.2f}" for s in shares) + f" (worst {max(abs(s - 1) for s in shares) * 100:.0f}% off)")
EOF
stop_started; pids=()

echo "== C. tail: one of three pods ten times slower, concurrency 32"
pod c-pod0 1 18140; pod c-pod1 1 18150; pod c-pod2 10 18160
endpoints=(127.0.0.1:18140,127.0.0.1:18141 127.0.0.1:18150,127.0.0.1:18151 127.0.0.1:18160,127.0.0.1:18161)
for picker in least-loaded round-robin; do
    gateway "c-gateway-$picker" "$picker" "${endpoints[@]}"; gateway_pid=$last_pid
    perf "c-$picker" 127.0.0.1:18201 32 --one-connection
    stop "$gateway_pid"
done
read -r ll_rate ll_p50 ll_p99 <<<"$(summary c-least-loaded)"
read -r rr_rate rr_p50 rr_p99 <<<"$(summary c-round-robin)"
python3 - "$ll_rate" "$ll_p50" "$ll_p99" "$rr_rate" "$rr_p50" "$rr_p99" <<'EOF' | tee -a "$out/summary.txt"
import sys
lr, lp50, lp99, rr, rp50, rp99 = sys.argv[1:]
print(f"tail: least-loaded {float(lr):.0f} infer/s p50 {lp50} us p99 {lp99} us | "
      f"round-robin {float(rr):.0f} infer/s p50 {rp50} us p99 {rp99} us | "
      f"p99 round-robin / least-loaded {int(rp99) / max(int(lp99), 1):.2f}")
EOF
