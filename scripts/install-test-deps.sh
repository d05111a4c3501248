#!/usr/bin/env bash
# Installs the Debian packages the integration tests use: nginx, which
# load-balances gRPC across gateway replicas; chromium, the headless browser
# that drives the Librarian's review page; and python3, which runs the
# bridge's example tool agents. Idempotent; needs root (CI and the
# development machines run as root) or sudo.
set -euo pipefail
packages=(nginx chromium python3)
missing=()
for p in "${packages[@]}"; do
	command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] || missing+=("$p")
done
# ca-certificates has no command: `make images` and deploy/images' test copy
# its bundle into the images' base.
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# The tests start nginx themselves on free loopback ports; the package's own
# service is never started (there is no init system here to start it).
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
