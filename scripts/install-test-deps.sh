#!/usr/bin/env bash
# Installs the Debian packages the integration tests use: nginx, which
# load-balances gRPC across gateway replicas; chromium, the headless browser
# that drives the Librarian's review page; python3, which runs the bridge's
# example tool agents (in e2e's Kubernetes shape, in a pod); containerd
# (with runc), the CNI plugins, iptables and iproute2, which
# kubeenv.KubeNode's single-node Kubernetes cluster runs pods with. Idempotent; needs root (CI and the development
# machines run as root) or sudo.
set -euo pipefail
packages=(nginx chromium containerd iptables)
missing=()
for p in "${packages[@]}"; do
	command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] || missing+=("$p")
done
# Debian's own python3, not just any on PATH: e2e's Kubernetes shape copies
# it, with the libraries it loads, into the runner's image.
[ -x /usr/bin/python3 ] || missing+=(python3)
# ca-certificates has no command: `make images` and deploy/images' test copy
# its bundle into the images' base.
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
# Nor have the CNI plugins, which live in /usr/lib/cni.
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# The tests start nginx and containerd themselves (on free loopback ports, or
# inside a network namespace of their own); the packages' services are never
# started (there is no init system here to start them).
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
