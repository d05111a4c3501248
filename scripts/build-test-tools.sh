#!/usr/bin/env bash
# Builds the heavy real components the integration tests run against into
# .cache/bin, each from its own pinned module under tools/ (outside go.work,
# so their conflicting dependency versions never meet):
#
#   tools/k8s     kube-apiserver, etcd, and the node: kubelet,
#                 kube-controller-manager, kube-scheduler, kube-proxy
#   tools/jaeger  jaeger-all-in-one
#   tools/helm    helm
#
# A tool is rebuilt only when one of its binaries is missing or its module's
# go.mod/go.sum changed since the last build (a stamp per module holds their
# sha256). Needs nothing but Go; the module proxy supplies the sources.
#
# Usage: scripts/build-test-tools.sh [k8s|jaeger|helm ...]   (default: all)
# BIN overrides the output directory; FORCE=1 rebuilds regardless of stamps.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${BIN:-$root/.cache/bin}
mkdir -p "$bin"

export GOWORK=off
# Link without symbol tables and DWARF: it saves a good part of the link time
# and size of these large binaries, which are never debugged here.
ldflags_common="-s -w"

# Several test binaries may ask for the tools at once: one builds, the others
# wait for it and then find everything up to date.
if command -v flock >/dev/null 2>&1; then
	exec 9>"$bin/.build-test-tools.lock"
	flock 9
fi

now() { date +%s; }

# version MODDIR MODULE prints the version MODDIR's build list selects for MODULE.
version() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }

# build NAME OUT=PKG... builds each PKG of tools/NAME into $bin/OUT, with the
# extra -ldflags in the variable ldflags_OUT (dashes as underscores). All of a
# module's binaries come from one `go build`, which compiles the packages they
# share once and keeps both cores busy while one binary links.
build() {
	local name=$1
	shift
	local dir=$root/tools/$name
	local stamp=$bin/.stamp-$name
	local sum
	sum=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -d' ' -f1)

	local stale=${FORCE:-}
	[[ -f $stamp && $(<"$stamp") == "$sum" ]] || stale=1
	local spec
	for spec in "$@"; do
		[[ -x $bin/${spec%%=*} ]] || stale=1
	done
	if [[ -z $stale ]]; then
		echo "build-test-tools: $name up to date"
		return
	fi

	local start out pkg var elem
	local pkgs=() flags=()
	start=$(now)
	rm -f "$stamp"
	for spec in "$@"; do
		out=${spec%%=*}
		pkg=${spec#*=}
		var=ldflags_${out//-/_}
		pkgs+=("$pkg")
		# A package pattern before the flags scopes them to that binary.
		flags+=("-ldflags=$pkg=$ldflags_common ${!var:-}")
	done
	# Into a temporary directory first, so a reader never sees half a binary.
	local tmp=$bin/.build-$name.$$
	rm -rf "$tmp"
	mkdir "$tmp"
	trap 'rm -rf "$tmp"' EXIT
	echo "build-test-tools: building ${*%%=*} ..."
	(cd "$dir" && go build -trimpath "${flags[@]}" -o "$tmp/" "${pkgs[@]}")
	for spec in "$@"; do
		out=${spec%%=*}
		pkg=${spec#*=}
		# go build names a binary after its package's last path element,
		# skipping a major version suffix (go.etcd.io/etcd/server/v3 -> server).
		elem=${pkg##*/}
		[[ $elem =~ ^v[0-9]+$ ]] && elem=${pkg%/*} && elem=${elem##*/}
		mv -f "$tmp/$elem" "$bin/$out"
	done
	rm -rf "$tmp"
	trap - EXIT
	echo "$sum" >"$stamp"
	echo "build-test-tools: $name done in $(($(now) - start))s"
}

k8s() {
	local v
	v=$(version "$root/tools/k8s" k8s.io/kubernetes)
	local major=${v#v}
	major=${major%%.*}
	local minor=${v#v*.}
	minor=${minor%%.*}
	# What kubernetes' own release build stamps: clients (helm's kubeVersion
	# checks among them) read it through the discovery /version endpoint.
	local p=k8s.io/component-base/version
	# The kubelet reports it as the node's version too.
	local stamped="-X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	ldflags_kube_apiserver=$stamped
	ldflags_kubelet=$stamped
	ldflags_kube_controller_manager=$stamped
	ldflags_kube_scheduler=$stamped
	ldflags_kube_proxy=$stamped
	build k8s \
		kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
		etcd=go.etcd.io/etcd/server/v3 \
		kubelet=k8s.io/kubernetes/cmd/kubelet \
		kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
		kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
		kube-proxy=k8s.io/kubernetes/cmd/kube-proxy
}

jaeger() {
	local v
	v=$(version "$root/tools/jaeger" github.com/jaegertracing/jaeger)
	ldflags_jaeger_all_in_one="-X github.com/jaegertracing/jaeger/pkg/version.latestVersion=$v"
	build jaeger jaeger-all-in-one=github.com/jaegertracing/jaeger/cmd/all-in-one
}

helm() {
	local v k
	v=$(version "$root/tools/helm" helm.sh/helm/v3)
	# What helm's own release build (its Makefile) stamps besides its
	# version: the Kubernetes version `helm template` and `helm lint`
	# assume without --kube-version, that of the client-go it is built
	# with (v0.37.0 -> 1.37). Unstamped, a helm built from source assumes
	# 1.20, below the chart's kubeVersion. A change of these flags needs a
	# change of tools/helm/go.mod (its comment) to rebuild built machines:
	# the stamp covers only go.mod and go.sum.
	k=$(version "$root/tools/helm" k8s.io/client-go)
	k=${k#v}
	local major=$((${k%%.*} + 1))
	local minor=${k#*.}
	minor=${minor%%.*}
	ldflags_helm="-X helm.sh/helm/v3/internal/version.version=$v -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
	local p
	for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
		ldflags_helm+=" -X $p.k8sVersionMajor=$major -X $p.k8sVersionMinor=$minor"
	done
	build helm helm=helm.sh/helm/v3/cmd/helm
}

total=$(now)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(k8s jaeger helm)
for t in "${targets[@]}"; do
	case $t in
	k8s | jaeger | helm) ;;
	*)
		echo "build-test-tools: unknown tool $t (want k8s, jaeger or helm)" >&2
		exit 2
		;;
	esac
done
# The modules build side by side: each go build downloads its module's
# dependencies first and ends linking its binaries, and one core is idle
# through either unless another build fills it (bench/ci.md).
pids=()
for t in "${targets[@]}"; do
	"$t" &
	pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do
	wait "$pid" || failed=1
done
[[ $failed -eq 0 ]] || {
	echo "build-test-tools: a build failed" >&2
	exit 1
}
echo "build-test-tools: all done in $(($(now) - total))s"
