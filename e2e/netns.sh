#!/usr/bin/env bash
# Runs a command in a network namespace of its own: the e2e suite's whole run (its control plane,
# its process nodes, their pods' namespaces, bridges and veths, kube-proxy's rules, the ClusterIPs,
# the harness and its load generators) lives in there, so every address it sends to is loopback or
# inside a namespace the run made, and nothing of it touches this machine's routes, interfaces or
# iptables.
#
#   e2e/netns.sh COMMAND [ARGS...]
#
# It is a mount namespace too, for two folders the process node writes and `ip netns` reads:
# /run/netns, where `ip netns add` pins each pod's network namespace, and /etc/netns, where
# `ip netns exec` finds a pod's own hosts and resolv.conf. Both are tmpfs mounts seen only inside;
# on this machine they are empty folders (made if missing). When the run's last process exits,
# however it ends (SIGKILL included), the kernel frees the mount namespace, so the pods' pinned
# namespaces, and the run's own with its bridges and veths: nothing is left to clean up.
#
# Needs root (CAP_SYS_ADMIN for the namespaces and the mounts).
set -euo pipefail

if [[ "${1:-}" != --inside ]]; then
  [[ $# -gt 0 ]] || { echo "usage: e2e/netns.sh COMMAND [ARGS...]" >&2; exit 2; }
  mkdir -p /run/netns /etc/netns
  exec unshare --net --mount --propagation private -- "$0" --inside "$@"
fi
shift

ip link set lo up
mount -t tmpfs -o mode=0755,size=16m nereid-e2e-netns /run/netns
mount -t tmpfs -o mode=0755,size=16m nereid-e2e-netns /etc/netns
exec "$@"
