#!/usr/bin/env bash
# Builds the e2e control plane's binaries from their Go modules, once per version, into a cache
# directory outside the repository, and prints the directory that holds them.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
#   kube-proxy                                                         k8s.io/kubernetes
#   etcd                                                               go.etcd.io/etcd/server/v3
#   coredns (the cluster's DNS)                                        github.com/coredns/coredns
#   kwok                                                               sigs.k8s.io/kwok
#   helm                                                               helm.sh/helm/v3
#   keda-crds/ (KEDA's ScaledObject CRD, not KEDA itself)              github.com/kedacore/keda/v2
#
# Everything comes from the Go module proxy. k8s.io/kubernetes cannot be `go install`ed: its go.mod
# requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces them with
# folders inside its own tree, and replace directives only count in the main module. So it is built
# from a small wrapper module that requires it and pins every staging module to the matching v0.X.Y
# tag. etcd's server module has the same kind of replaces and gets the same treatment.
#
# The Kubernetes minor matches the newest API the workspace compiles against (k8s-openapi's v1_37).
#
#   e2e/tools.sh              build what is missing, print the folder of the binaries
#   e2e/tools.sh --installed  print that folder if everything is built, else fail (builds nothing)
#
# Environment: NEREID_E2E_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/nereid-e2e).
set -euo pipefail

KUBERNETES_VERSION=v1.37.2
ETCD_VERSION=v3.7.3   # the etcd minor that Kubernetes 1.37's go.mod builds against
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
COREDNS_VERSION=v1.15.0   # its go.mod requires client-go v0.37, as Kubernetes 1.37's
KEDA_VERSION=v2.21.0

cache="${NEREID_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nereid-e2e}"
bin="$cache/bin/k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION-coredns-$COREDNS_VERSION"
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -trimpath"

log() { echo "e2e/tools.sh: $*" >&2; }

# A tool is built when its folder holds a stamp; the stamp is written only after every binary of
# the folder was built, so an interrupted build starts over instead of leaving half a set.
built() { [[ -f "$1/.complete" ]]; }

# Writes a wrapper module in $1 that requires $2 at $3, with extra go.mod text from stdin.
wrapper_module() {
  local dir=$1 module=$2 version=$3
  rm -rf "$dir" && mkdir -p "$dir"
  {
    echo "module nereid.local/e2e-tools"
    echo
    echo "go 1.26.0"
    echo
    echo "require $module $version"
    cat
  } >"$dir/go.mod"
}

# The commands built from k8s.io/kubernetes.
KUBERNETES_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kube-proxy)

build_kubernetes() {
  local out="$cache/kubernetes-$KUBERNETES_VERSION" command missing=0
  # A folder built before a command joined the list is built again (the Go caches make that quick).
  for command in "${KUBERNETES_COMMANDS[@]}"; do [[ -x "$out/$command" ]] || missing=1; done
  built "$out" && ((missing == 0)) && return
  log "building Kubernetes $KUBERNETES_VERSION (${KUBERNETES_COMMANDS[*]})"
  local work="$cache/work/kubernetes" gomod staging minor="${KUBERNETES_VERSION#v1.}"
  gomod=$(cd "$cache" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
  # The staging modules are exactly the k8s.io requirements at the placeholder version v0.0.0.
  staging=$(sed -n 's/^\s*\(k8s\.io\/[a-z0-9-]*\) v0\.0\.0$/\1/p' "$gomod" | sort -u)
  [[ -n "$staging" ]] || { log "no staging modules found in $gomod"; return 1; }
  {
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m v0.$minor"; done
    echo ")"
  } | wrapper_module "$work" k8s.io/kubernetes "$KUBERNETES_VERSION"
  cat >"$work/tools.go" <<'GO'
//go:build tools

// Package tools names the commands this module builds, so that `go mod tidy` keeps what they need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  local major=${KUBERNETES_VERSION#v}; major=${major%%.*}
  local mminor=${minor%%.*} ldflags="-s -w" pkg
  # What hack/lib/version.sh stamps, so /version and `kubectl version` report the real release.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$mminor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (
    cd "$work"
    go mod tidy
    mkdir -p "$out.tmp"
    go build -ldflags "$ldflags" -o "$out.tmp/" "${KUBERNETES_COMMANDS[@]/#/k8s.io/kubernetes/cmd/}"
  )
  finish "$out"
}

build_etcd() {
  local out="$cache/etcd-$ETCD_VERSION"
  built "$out" && return
  log "building etcd $ETCD_VERSION"
  local work="$cache/work/etcd"
  wrapper_module "$work" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" </dev/null
  cat >"$work/tools.go" <<'GO'
//go:build tools

// Package tools names the command this module builds, so that `go mod tidy` keeps what it needs.
package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  (
    cd "$work"
    go mod tidy
    mkdir -p "$out.tmp"
    go build -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  )
  finish "$out"
}

# kwok and helm have no replace directives, so `go install` takes them as released.
#   go_install NAME VERSION PACKAGE LDFLAGS [FOLDER-SUFFIX]
go_install() {
  local name=$1 version=$2 pkg=$3 out="$cache/$1-$2${5:-}"
  built "$out" && return
  log "building $name $version"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -ldflags "-s -w ${4:-}" "$pkg@$version"
  finish "$out"
}

# KWOK acts on Stages: what to do to a node or pod in which state. It ships its usual ones as YAML
# in its module (kustomize/stage); they are copied from the module cache next to the binary.
build_kwok() {
  local out="$cache/kwok-$KWOK_VERSION"
  built "$out" && return
  go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -unstaged
  local module stage
  module=$(cd "$cache" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$out.tmp/stages"
  cp "$out-unstaged/kwok" "$out.tmp/"
  for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
    pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    cp "$module/kustomize/stage/$stage.yaml" "$out.tmp/stages/"
  done
  rm -rf "$out-unstaged"
  finish "$out"
}

# The operator can make KEDA ScaledObjects; the e2e suite installs KEDA's own CRD for them (KEDA
# itself does not run: it would replace the operator's external metrics APIService). The CRD is
# a file in KEDA's module, copied from the module cache.
fetch_keda_crds() {
  local out="$cache/keda-$KEDA_VERSION"
  built "$out" && return
  log "fetching KEDA $KEDA_VERSION's ScaledObject CRD"
  local module
  module=$(cd "$cache" && go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$out.tmp/crds"
  cp "$module/config/crd/bases/keda.sh_scaledobjects.yaml" "$out.tmp/crds/"
  chmod u+w "$out.tmp/crds/"*
  finish "$out"
}

finish() {
  touch "$1.tmp/.complete"
  rm -rf "$1" && mv "$1.tmp" "$1"
}

if [[ "${1:-}" == --installed ]]; then
  for tool in "${KUBERNETES_COMMANDS[@]}" etcd kwok helm coredns; do
    [[ -x "$bin/$tool" ]] || exit 1
  done
  [[ -d "$bin/kwok-stages" ]] || exit 1
  [[ -d "$bin/keda-crds" ]] || exit 1
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
build_etcd
build_kwok
# helm's Makefile stamps the Kubernetes version it was built against; without it `helm template`
# assumes v1.20 and refuses charts that need newer. Its folder name carries the stamp.
go_install helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37 \
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37" -k8s-1.37
build_kubernetes
# CoreDNS has no replace directives either; its default build holds every plugin, kubernetes included.
go_install coredns "$COREDNS_VERSION" github.com/coredns/coredns \
  "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"
fetch_keda_crds

mkdir -p "$bin"
for tool in "${KUBERNETES_COMMANDS[@]}"; do
  ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/$tool" "$bin/$tool"
done
ln -sf "$cache/etcd-$ETCD_VERSION/etcd" "$bin/etcd"
ln -sf "$cache/coredns-$COREDNS_VERSION/coredns" "$bin/coredns"
ln -sf "$cache/kwok-$KWOK_VERSION/kwok" "$bin/kwok"
ln -sfn "$cache/kwok-$KWOK_VERSION/stages" "$bin/kwok-stages"
ln -sf "$cache/helm-$HELM_VERSION-k8s-1.37/helm" "$bin/helm"
ln -sfn "$cache/keda-$KEDA_VERSION/crds" "$bin/keda-crds"
echo "$bin"
