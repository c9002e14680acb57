#!/usr/bin/env bash
# nereid-gateway against the L7 proxies users would otherwise put in front of
# their pods, in one run (issue 48): nginx's grpc_pass / proxy_pass and
# HAProxy in h2 mode, both Debian bookworm's (nginx 1.22, HAProxy 2.6).
#
# Three identity pods (nereid-server, FP32[1,16]); each proxy with one
# worker thread pinned to core 0, balancing per request over the three pods
# (nginx: upstream keepalive 64, keepalive_requests raised so connections
# are not recycled; HAProxy: h2 on both sides for gRPC, `http-reuse
# always`, roundrobin; the gateway: `--worker-threads 1`, static endpoints,
# its least-loaded picker). The pods and nereid-perf share core 1. For each
# proxy, protocol and concurrency (1, 8, 32): the proxy's CPU per request
# (nereid-perf's --server-pid, from /proc over each measurement window),
# its throughput, and its p50 against calling one pod directly.
#
# nginx and HAProxy are Debian's packages, downloaded with `apt-get
# download` and unpacked into the bench cache (never installed: no service
# starts, nothing outside the cache changes). Loopback only; every process
# started here is stopped by its PID.
#
#   bench/proxies.sh [--quick]
#
# A benchmark, not a test: nothing fails on a timing. Results go to
# bench/results/proxies/ and the table to stdout.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/setup.sh"
cd "$repo"
source "$repo/bench/wait_for_line.sh"

interval=3000
if [ "${1:-}" = "--quick" ]; then interval=1000; fi

cargo build --release --locked -q -p nereid-server -p nereid-gateway -p nereid-bench
bin="$repo/target/release"
out="$repo/bench/results/proxies"
rm -rf "$out" && mkdir -p "$out"

# Debian's nginx and HAProxy (and the libraries HAProxy needs that a slim
# machine lacks), unpacked once into the cache.
cache="${NEREID_BENCH_CACHE:-$HOME/.cache/nereid-bench}/proxies"
root="$cache/root"
if [ ! -x "$root/usr/sbin/nginx" ] || [ ! -x "$root/usr/sbin/haproxy" ]; then
    mkdir -p "$cache/debs"
    (cd "$cache/debs" && apt-get download nginx haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1) \
        || { echo "apt-get download failed (run apt-get update first)" >&2; exit 1; }
    for deb in "$cache/debs"/*.deb; do dpkg-deb -x "$deb" "$root"; done
fi
export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nginx_version=$("$root/usr/sbin/nginx" -v 2>&1 | sed 's/.*nginx\///')
haproxy_version=$("$root/usr/sbin/haproxy" -v | awk 'NR==1 {print $3}')

source "$repo/bench/processes.sh"
trap stop_started EXIT

# The pods: identity FP32[1,16] on 185x0 (HTTP), 185x1 (gRPC), 185x2 (metrics).
pod_ports=(18500 18510 18520)
mkdir -p "$out/models/identity/1"
cat >"$out/models/identity/config.pbtxt" <<EOF
name: "identity"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
EOF
for port in "${pod_ports[@]}"; do
    taskset -c 1 "$bin/nereid-server" --model-repository "$out/models" \
        --http-address 127.0.0.1 --http-port "$port" \
        --grpc-address 127.0.0.1 --grpc-port "$((port + 1))" \
        --metrics-address 127.0.0.1 --metrics-port "$((port + 2))" >"$out/pod-$port.log" 2>&1 &
    pids+=($!)
    wait_for_line "$out/pod-$port.log" "Started GRPCInferenceService" >/dev/null
done

# The proxies, each on core 0: gRPC on 186x0, HTTP on 186x1.
gateway_args=()
for port in "${pod_ports[@]}"; do gateway_args+=(--endpoint "identity=127.0.0.1:$port,127.0.0.1:$((port + 1))"); done
NO_COLOR=1 taskset -c 0 "$bin/nereid-gateway" --worker-threads 1 --address 127.0.0.1 \
    --grpc-port 18600 --http-port 18601 --metrics-port 18602 "${gateway_args[@]}" >"$out/gateway.log" 2>&1 &
pids+=($!); gateway_pid=$!
wait_for_line "$out/gateway.log" "nereid-gateway listening" >/dev/null

mkdir -p "$out/nginx/logs"
upstream() { for port in "${pod_ports[@]}"; do echo "        server 127.0.0.1:$((port + $1));"; done; }
cat >"$out/nginx/nginx.conf" <<EOF
worker_processes 1;
master_process off;
daemon off;
error_log stderr warn;
pid $out/nginx/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $out/nginx/body;
    proxy_temp_path $out/nginx/proxy;
    fastcgi_temp_path $out/nginx/fastcgi;
    uwsgi_temp_path $out/nginx/uwsgi;
    scgi_temp_path $out/nginx/scgi;
    upstream pods_grpc {
$(upstream 1)
        keepalive 64;
        keepalive_requests 100000000;
    }
    upstream pods_http {
$(upstream 0)
        keepalive 64;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:18610 http2;
        keepalive_requests 100000000;
        location / { grpc_pass grpc://pods_grpc; }
    }
    server {
        listen 127.0.0.1:18611;
        keepalive_requests 100000000;
        location / {
            proxy_pass http://pods_http;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
taskset -c 0 "$root/usr/sbin/nginx" -p "$out/nginx" -c "$out/nginx/nginx.conf" -e stderr >"$out/nginx.log" 2>&1 &
pids+=($!); nginx_pid=$!

servers() { for port in "${pod_ports[@]}"; do echo "    server p$port 127.0.0.1:$((port + $1)) $2"; done; }
cat >"$out/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    http-reuse always
frontend grpc_in
    bind 127.0.0.1:18620 proto h2
    default_backend pods_grpc
backend pods_grpc
    balance roundrobin
$(servers 1 "proto h2")
frontend http_in
    bind 127.0.0.1:18621
    default_backend pods_http
backend pods_http
    balance roundrobin
$(servers 0 "")
EOF
taskset -c 0 "$root/usr/sbin/haproxy" -db -f "$out/haproxy.cfg" >"$out/haproxy.log" 2>&1 &
pids+=($!); haproxy_pid=$!

# Both up: their ports answer.
for port in 18610 18611 18620 18621; do
    for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
done
for proxy in nginx haproxy; do
    pid_var="${proxy}_pid"
    kill -0 "${!pid_var}" 2>/dev/null || { echo "$proxy did not start:" >&2; cat "$out/$proxy.log" >&2; exit 1; }
done

# perf NAME PROTOCOL ADDRESS CONCURRENCY [PID]: nereid-perf on core 1.
perf() {
    local name=$1 protocol=$2 address=$3 concurrency=$4 pid=${5:-}
    local cpu=()
    if [ -n "$pid" ]; then cpu=(--server-pid "$pid"); fi
    taskset -c 1 "$bin/nereid-perf" -i "$protocol" -u "$address" -m identity \
        --shape INPUT0:1,16 --datatype INPUT0:FP32 --concurrency-list "$concurrency" \
        --measurement-interval "$interval" --json "$out/$name.json" "${cpu[@]}" >"$out/$name.txt" 2>&1 \
        || { echo "nereid-perf failed for $name" >&2; cat "$out/$name.txt" >&2; return 1; }
}

for protocol in grpc http; do
    offset=0
    if [ "$protocol" = http ]; then offset=1; fi
    for c in 1 8 32; do
        # One pod called directly: the p50 the proxies add to.
        if [ "$protocol" = grpc ]; then direct=127.0.0.1:18501; else direct=127.0.0.1:18500; fi
        perf "direct-$protocol-c$c" "$protocol" "$direct" "$c"
        perf "gateway-$protocol-c$c" "$protocol" "127.0.0.1:$((18600 + offset))" "$c" "$gateway_pid"
        perf "nginx-$protocol-c$c" "$protocol" "127.0.0.1:$((18610 + offset))" "$c" "$nginx_pid"
        perf "haproxy-$protocol-c$c" "$protocol" "127.0.0.1:$((18620 + offset))" "$c" "$haproxy_pid"
    done
done

python3 - "$out" "$nginx_version" "$haproxy_version" <<'EOF' | tee "$out/summary.txt"
import json, sys
out, nginx_version, haproxy_version = sys.argv[1:]
def result(name):
    return json.load(open(f"{out}/{name}.json"))[0]
names = {"gateway": "nereid-gateway", "nginx": f"nginx {nginx_version}", "haproxy": f"HAProxy {haproxy_version}"}
for protocol in ("grpc", "http"):
    print(f"\n{protocol}: CPU per request of the proxy (us), its throughput at c=32, p50 it adds at c=1 (us)")
    print("| proxy | CPU us/request c=1 | c=8 | c=32 | req/s c=32 | p50 added c=1 |")
    print("|---|---|---|---|---|---|")
    cpu = {}
    added = {}
    for proxy, label in names.items():
        cpu[proxy] = [result(f"{proxy}-{protocol}-c{c}")["server_cpu_us_per_request"] for c in (1, 8, 32)]
        rate = result(f"{proxy}-{protocol}-c32")["throughput"]
        added[proxy] = result(f"{proxy}-{protocol}-c1")["p50_us"] - result(f"direct-{protocol}-c1")["p50_us"]
        print(f"| {label} | " + " | ".join(f"{x:.1f}" for x in cpu[proxy]) + f" | {rate / 1000:.1f}k | {added[proxy]} us |")
    best = [min(cpu["nginx"][i], cpu["haproxy"][i]) for i in range(3)]
    ratios = ", ".join(f"c={c} {cpu['gateway'][i] / best[i]:.2f}x" for i, c in enumerate((1, 8, 32)))
    best_added = min(added["nginx"], added["haproxy"])
    print(f"gateway CPU / the better proxy's: {ratios}; p50 added at c=1: {added['gateway']} us against {best_added} us")
EOF
