#!/usr/bin/env bash
# The system packages relakit's set-up needs. Called by every Makefile target that sets up.
#
# Required: Prometheus and promtool (Debian's package `prometheus`), which the tests and the
# live lab start. Installed when missing and we may (root, or passwordless sudo); otherwise
# this stops at once with one line naming the package and the command.
#
# Wanted: the venv module and C headers of the distribution's python3 (Debian's
# `python3-venv`, `python3-dev`), so that tools/venv-python.sh can make .venv on that
# interpreter, built with profile-guided and link-time optimisation (that script says what
# it gains). Installed along when missing and we may; without them .venv is made on python3
# from PATH, as before.
set -euo pipefail
missing=()
for prog in prometheus promtool; do
  command -v "$prog" >/dev/null 2>&1 || missing+=("$prog")
done
. "$(dirname "$0")/python-checks.sh"
wanted=()
if py_is_311 "$DISTRO_PYTHON"; then
  py_has_venv "$DISTRO_PYTHON" || wanted+=(python3-venv)
  py_has_headers "$DISTRO_PYTHON" || wanted+=(python3-dev)
fi
[ ${#missing[@]} -eq 0 ] && [ ${#wanted[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  sudo=(false)
fi
if [ "${sudo[*]}" = false ] || ! command -v apt-get >/dev/null 2>&1; then
  [ ${#missing[@]} -eq 0 ] && exit 0  # only the wanted ones: .venv goes on python3 from PATH
  if [ "${sudo[*]}" = false ]; then
    echo "relakit: error: ${missing[*]} missing (Debian package 'prometheus'); install it with: sudo apt-get install prometheus" >&2
  else
    echo "relakit: error: ${missing[*]} missing and no apt-get here; install Prometheus 2.x so that 'prometheus' and 'promtool' are on PATH" >&2
  fi
  exit 1
fi
echo "relakit: installing Debian's ${missing[*]:+prometheus }${wanted[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  for prog in prometheus promtool; do
    command -v "$prog" >/dev/null 2>&1 || {
      echo "relakit: error: installed 'prometheus' but '$prog' is still not on PATH" >&2; exit 1; }
  done
fi
if [ ${#wanted[@]} -gt 0 ]; then  # a speed-up, not a need: on failure .venv goes on python3
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null \
    || echo "relakit: could not install ${wanted[*]}; .venv will be made on python3 from PATH" >&2
fi
