#!/usr/bin/env bash
# Runs a real Kubernetes control plane as local processes on 127.0.0.1, the way controller-runtime's
# envtest does, plus what makes it a cluster without a container engine: kube-controller-manager
# (Deployments become ReplicaSets and Pods, garbage collection, the HPA controller), kube-scheduler
# (Pods are placed by the real scheduler, whose reasons end up in Pod conditions) and KWOK, which
# keeps a few fake nodes alive and plays the kubelet for the Pods bound to them.
#
#   e2e/netns.sh e2e/cluster.sh DIR
#
# It runs only inside the network namespace e2e/netns.sh makes (it refuses to start elsewhere):
# there the API server and the S3 endpoint listen on every address, the process nodes' bridges and
# kube-proxy's rules live, and none of it reaches this machine's own network.
#
# Everything lives in DIR: certificates, etcd's data, one log per component, and DIR/kubeconfig
# (cluster admin). When the cluster is ready the script prints one line, "ready DIR/kubeconfig",
# on stdout; then it supervises: it tears everything down (by PID, TERM then KILL) when its stdin
# closes, when one of its components dies, or after NEREID_E2E_MAX_SECONDS (default 2400), so a
# crashed or killed test harness never leaves a control plane behind. Each component also runs
# under timeout(1) with the same bound, in case this script itself is killed.
#
# Binaries: NEREID_E2E_BIN, or whatever e2e/tools.sh builds (and caches).
#
# With NEREID_PROC_NODE_BIN (the nereid-proc-node binary) and NEREID_IMAGE_BIN_DIR (where
# nereid-server, nereid-fetch and nereid-operator are), it also starts the process-backed nodes
# (e2e/proc-node): proc-0, proc-1 and proc-gpu-0, tainted nereid.dev/process-node=true:NoSchedule
# so only pods that ask for them land there, whose pods run as local processes, each in a network
# namespace of its own on a pod IP from NEREID_POD_CIDR (10.244.0.0/16 by default; node i has
# 10.244.i.0/24 on its bridge, whose address 10.244.i.1 is the node's). With them come the Services
# of a real cluster: kube-proxy (iptables mode) for ClusterIPs and NodePorts, and CoreDNS serving
# cluster.local from the API server behind the kube-dns Service (10.96.0.10), which every pod's
# resolv.conf names. Pods reach the API server as in-cluster clients do, through the `kubernetes`
# Service (10.96.0.1:443), whose endpoint is the API server on proc-0's address.
#
# With NEREID_MOTO_SERVER (moto's S3 server, from the Python test environment), it also runs an
# S3 endpoint for model sources, written to DIR/s3-endpoint (on proc-0's address, which pods
# reach) once it answers.
set -euo pipefail

dir=${1:?usage: e2e/cluster.sh DIR}
max_seconds=${NEREID_E2E_MAX_SECONDS:-2400}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${NEREID_E2E_BIN:-$("$here/tools.sh")}
mkdir -p "$dir"/{pki,etcd,logs}
dir=$(cd "$dir" && pwd)
pki=$dir/pki
kubeconfig=$dir/kubeconfig
deadline=$((SECONDS + max_seconds))
pod_cidr=${NEREID_POD_CIDR:-10.244.0.0/16}
# proc-0's address (its bridge's, 10.244.0.1): where the host's own services are reached from pods.
node_ip=${pod_cidr%.*.*/16}.0.1
service_cidr=10.96.0.0/16
api_service_ip=10.96.0.1
dns_service_ip=10.96.0.10

log() { echo "e2e/cluster.sh: $*" >&2; }

# The namespaces' private /etc/netns is e2e/netns.sh's mark (the network namespace has none).
if ! grep -q ' /etc/netns .* - tmpfs nereid-e2e-netns ' /proc/self/mountinfo; then
  log "not inside e2e/netns.sh's namespaces; run it as: e2e/netns.sh e2e/cluster.sh DIR"
  exit 2
fi

# --- processes ------------------------------------------------------------------------------

declare -A pids=()
start() {
  local name=$1
  shift
  timeout --signal=TERM --kill-after=10 "$max_seconds" "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  pids[$name]=$!
  echo "${pids[$name]}" >"$dir/$name.pid"
}

teardown() {
  local name pid
  # Nothing interrupts the teardown itself.
  trap - EXIT
  trap '' INT TERM
  # Reverse order of start: the kubelet stand-ins and controllers before the API server, etcd last.
  for name in coredns kube-proxy proc-node kwok kube-scheduler kube-controller-manager kube-apiserver etcd moto; do
    pid=${pids[$name]:-}
    [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/$name.pid"
  done
  wait 2>/dev/null || true
  log "stopped"
}
trap teardown EXIT
trap 'exit 130' INT TERM

fail() {
  log "$*"
  local name
  for name in "${!pids[@]}"; do
    kill -0 "${pids[$name]}" 2>/dev/null || { log "$name exited; the end of its log:"; tail -n 20 "$dir/logs/$name.log" >&2; }
  done
  exit 1
}

# Waits until "$@" succeeds, up to $wait_seconds.
wait_for() {
  local what=$1 limit=$2
  shift 2
  local until=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < until)) || fail "$what did not come up within ${limit}s"
    for name in "${!pids[@]}"; do kill -0 "${pids[$name]}" 2>/dev/null || fail "$name exited"; done
    sleep 0.5
  done
}

# --- ports and certificates -----------------------------------------------------------------

read -r etcd_port etcd_peer_port api_port kwok_port s3_port proxy_health_port proxy_metrics_port dns_ready_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(8)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
')

# P-256 keys in PKCS#8, which every client here reads (Go, rustls, OpenSSL).
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/$1.key" 2>/dev/null; }
ca() {
  key "$1"
  openssl req -x509 -new -key "$pki/$1.key" -subj "/CN=$2" -days 2 -out "$pki/$1.crt" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}
# cert NAME CA SUBJECT EXTENSIONS
cert() {
  key "$1"
  openssl req -new -key "$pki/$1.key" -subj "$3" 2>/dev/null |
    openssl x509 -req -CA "$pki/$2.crt" -CAkey "$pki/$2.key" -CAcreateserial -days 2 \
      -extfile <(printf '%b' "$4") -out "$pki/$1.crt" 2>/dev/null
}
ca ca nereid-e2e-ca
cert apiserver ca /CN=kube-apiserver \
  "subjectAltName=IP:127.0.0.1,IP:$api_service_ip,IP:$node_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature"
cert admin ca '/O=system:masters/CN=nereid-e2e-admin' 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature'
# The aggregation layer's front proxy, so an APIService (a metrics adapter) can be registered.
ca front-proxy-ca nereid-e2e-front-proxy-ca
cert front-proxy-client front-proxy-ca /CN=front-proxy-client 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature'
# Service account tokens are signed with this key (ES256).
key sa && openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null

cat >"$kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: nereid-e2e
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: admin
  user:
    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key
contexts:
- name: nereid-e2e
  context: {cluster: nereid-e2e, user: admin}
current-context: nereid-e2e
YAML
kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# --- the control plane ----------------------------------------------------------------------

# The S3 endpoint starts first: it is slow to import and nothing waits on it until the end.
if [[ -n "${NEREID_MOTO_SERVER:-}" ]]; then
  log "moto (S3) on port $s3_port"
  start moto "$NEREID_MOTO_SERVER" -H 0.0.0.0 -p "$s3_port"
fi

log "etcd on 127.0.0.1:$etcd_port"
start etcd "$bin/etcd" --name nereid-e2e --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "nereid-e2e=http://127.0.0.1:$etcd_peer_port" \
  --unsafe-no-fsync --log-level warn
wait_for etcd 60 python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$etcd_port/health', timeout=2)"

# Every address of the namespace: the harness dials 127.0.0.1, pods the `kubernetes` Service, whose
# endpoint the reconciler publishes as the advertise address (it refuses a loopback one).
log "kube-apiserver on https://127.0.0.1:$api_port"
start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 0.0.0.0 --advertise-address "$node_ip" --secure-port "$api_port" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-cluster-ip-range "$service_cidr" \
  --authorization-mode Node,RBAC \
  --requestheader-client-ca-file "$pki/front-proxy-ca.crt" \
  --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$pki/front-proxy-client.crt" --proxy-client-key-file "$pki/front-proxy-client.key" \
  --enable-aggregator-routing \
  --enable-admission-plugins OwnerReferencesPermissionEnforcement \
  --profiling=false
wait_for kube-apiserver 120 kubectl get --raw /readyz

log "kube-controller-manager and kube-scheduler"
start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$kubeconfig" --authentication-kubeconfig "$kubeconfig" --authorization-kubeconfig "$kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --use-service-account-credentials=false \
  --horizontal-pod-autoscaler-sync-period 2s \
  --profiling=false
start kube-scheduler "$bin/kube-scheduler" \
  --kubeconfig "$kubeconfig" --authentication-kubeconfig "$kubeconfig" --authorization-kubeconfig "$kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --profiling=false

# KWOK plays the kubelet for nodes annotated kwok.x-k8s.io/node=fake. Pod and node IPs are on
# loopback, so anything that dials a pod (the operator asks ready pods for their model versions)
# stays on this machine and is refused at once.
log "kwok"
stages=$(printf '%s,' "$bin"/kwok-stages/*.yaml)
start kwok "$bin/kwok" --kubeconfig "$kubeconfig" --config "${stages%,}" --node-lease-duration-seconds 40 \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --cidr 127.0.100.1/24 --node-ip 127.0.0.1 \
  --server-address "127.0.0.1:$kwok_port"

# Two CPU nodes and two GPU nodes (4 GPUs each, with the taint and labels the NVIDIA GPU operator
# puts on GPU nodes).
node() {
  local name=$1 gpus=$2 extra_labels="" spec=" {}" gpu_capacity=""
  if ((gpus > 0)); then
    extra_labels="
    nvidia.com/gpu.present: \"true\"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.count: \"$gpus\""
    spec="
  taints:
  - {key: nvidia.com/gpu, value: present, effect: NoSchedule}"
    gpu_capacity="
    nvidia.com/gpu: \"$gpus\""
  fi
  cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok$extra_labels
spec:$spec
status:
  allocatable: &resources
    cpu: "32"
    memory: 256Gi
    pods: "110"$gpu_capacity
  capacity: *resources
YAML
}
{ node cpu-0 0; node cpu-1 0; node gpu-0 4; node gpu-1 4; } | kubectl create -f - >/dev/null
wait_for "the KWOK nodes" 60 kubectl wait --for=condition=Ready node -l type=kwok --timeout=2s

# The process-backed nodes: pods that really run, each in its own network namespace.
if [[ -n "${NEREID_PROC_NODE_BIN:-}" ]]; then
  log "process nodes (pods in network namespaces of their own, on $pod_cidr)"
  start proc-node "$NEREID_PROC_NODE_BIN" --kubeconfig "$kubeconfig" \
    --nodes proc-0,proc-1,proc-gpu-0:gpu=4 --cidr "$pod_cidr" \
    --bin-dir "${NEREID_IMAGE_BIN_DIR:?NEREID_IMAGE_BIN_DIR is needed with NEREID_PROC_NODE_BIN}" \
    --state-dir "$dir/pods" \
    --api-server "$api_service_ip:443" --api-ca "$pki/ca.crt" --cluster-dns "$dns_service_ip" \
    --max-seconds "$max_seconds" --backoff-seconds 2
  wait_for "the process nodes" 60 kubectl wait --for=condition=Ready node -l nereid.dev/process-node=true --timeout=2s

  # One kube-proxy serves the three nodes: they share this namespace, hence one set of iptables
  # rules. Conntrack's limits are the machine's own, not this namespace's: left alone (0).
  log "kube-proxy (iptables) and CoreDNS"
  start kube-proxy "$bin/kube-proxy" --kubeconfig "$kubeconfig" --hostname-override proc-0 \
    --proxy-mode iptables --cluster-cidr "$pod_cidr" \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
    --healthz-bind-address "127.0.0.1:$proxy_health_port" --metrics-bind-address "127.0.0.1:$proxy_metrics_port"

  # The cluster's DNS, answering for cluster.local from the API server; nothing beyond it (no
  # upstream: the namespace reaches nothing outside).
  cat >"$dir/Corefile" <<COREFILE
.:53 {
    errors
    ready 127.0.0.1:$dns_ready_port
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $kubeconfig nereid-e2e
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
}
COREFILE
  start coredns "$bin/coredns" -conf "$dir/Corefile"
  # kube-dns as kubeadm names it, its endpoint the CoreDNS above (a selectorless Service).
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $dns_service_ip
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-coredns
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: nereid-e2e}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
endpoints: [{addresses: ["$node_ip"], conditions: {ready: true}}]
YAML
  wait_for kube-proxy 60 python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$proxy_health_port/healthz', timeout=2)"
  wait_for CoreDNS 60 python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$dns_ready_port/ready', timeout=2)"
fi
wait_for "the default ServiceAccount" 60 kubectl get serviceaccount default -n default
if [[ -n "${NEREID_MOTO_SERVER:-}" ]]; then
  wait_for "moto" 60 python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$s3_port/', timeout=2)"
  echo "http://$node_ip:$s3_port" >"$dir/s3-endpoint"
fi

echo "ready $kubeconfig"
log "ready: kubeconfig $kubeconfig, logs in $dir/logs"

# --- supervise ------------------------------------------------------------------------------

while true; do
  rc=0
  read -r -t 2 _ || rc=$?
  ((rc == 0)) && continue
  ((rc > 128)) || { log "stdin closed: tearing down"; break; }
  ((SECONDS < deadline)) || { log "ran for ${max_seconds}s: tearing down"; break; }
  for name in "${!pids[@]}"; do
    kill -0 "${pids[$name]}" 2>/dev/null || fail "$name exited unexpectedly"
  done
done
