#!/usr/bin/env bash
# The system programs relakit's tests and live lab start: Prometheus and promtool
# (Debian's package `prometheus`). Called by every Makefile target that sets up.
# Installs them when missing and we may (root, or passwordless sudo); otherwise
# stops at once with one line naming the package and the command.
set -euo pipefail
missing=()
for prog in prometheus promtool; do
  command -v "$prog" >/dev/null 2>&1 || missing+=("$prog")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "relakit: error: ${missing[*]} missing (Debian package 'prometheus'); install it with: sudo apt-get install prometheus" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "relakit: error: ${missing[*]} missing and no apt-get here; install Prometheus 2.x so that 'prometheus' and 'promtool' are on PATH" >&2
  exit 1
fi
echo "relakit: installing Debian's prometheus package (${missing[*]} missing)" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null
for prog in prometheus promtool; do
  command -v "$prog" >/dev/null 2>&1 || {
    echo "relakit: error: installed 'prometheus' but '$prog' is still not on PATH" >&2; exit 1; }
done
