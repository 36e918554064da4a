#!/usr/bin/env bash
# deps.sh — install the Debian packages shoal builds and tests with (idempotent; root or sudo).
# Each package and why is listed in README.md. Skips apt entirely when all are present.
set -euo pipefail
PKGS=(build-essential pkg-config clang libclang-rt-14-dev
      libxxhash-dev libjansson-dev libmicrohttpd-dev libcurl4-openssl-dev libcmocka-dev liburing-dev
      python3 python3-pytest python3-pytest-xdist python3-pymemcache libmemcached-tools memcached nutcracker
      python3-memcache python3-pylibmc php-cli php-memcached libcache-memcached-perl
      etcd-server postgresql nftables libpq-dev zlib1g-dev libjs-chart.js chromium chromium-driver python3-selenium)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
