#!/usr/bin/env bash
# The system packages relakit's set-up needs. Called by every Makefile target that sets up.
#
# Required: Prometheus and promtool (Debian's package `prometheus`), which the tests and the
# live lab start; wrk (Debian's `wrk`), the external load tool the lab's front is tested
# with (tests/test_lab_front.py, docs/lab.md's example); with --browser (`make test`) also Chromium and its WebDriver (Debian's
# `chromium`, `chromium-driver`), which the browser test drives headless against JupyterLab
# (tests/test_browser.py), so `make lab` and `make run` do not need them.
# Installed when missing and we may (root, or passwordless sudo); otherwise this stops at
# once with one line naming the packages and the command.
#
# Wanted: the venv module and C headers of the distribution's python3 (Debian's
# `python3-venv`, `python3-dev`), so that tools/venv-python.sh can make .venv on that
# interpreter, built with profile-guided and link-time optimisation (that script says what
# it gains). Installed along when missing and we may; without them .venv is made on python3
# from PATH, as before.
set -euo pipefail
# program -> the Debian package that installs it
declare -A package=([prometheus]=prometheus [promtool]=prometheus [wrk]=wrk
                    [chromium]=chromium [chromedriver]=chromium-driver)
missing=()   # programs
packages=()  # the packages that install them, each once
progs=(prometheus promtool wrk)
[ "${1:-}" = --browser ] && progs+=(chromium chromedriver)
for prog in "${progs[@]}"; do
  command -v "$prog" >/dev/null 2>&1 && continue
  missing+=("$prog")
  [[ " ${packages[*]} " == *" ${package[$prog]} "* ]] || packages+=("${package[$prog]}")
done
. "$(dirname "$0")/python-checks.sh"
wanted=()
if py_is_311 "$DISTRO_PYTHON"; then
  py_has_venv "$DISTRO_PYTHON" || wanted+=(python3-venv)
  py_has_headers "$DISTRO_PYTHON" || wanted+=(python3-dev)
fi
[ ${#missing[@]} -eq 0 ] && [ ${#wanted[@]} -eq 0 ] && exit 0
may_apt=1  # root or passwordless sudo, and apt-get here
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  sudo=()
  may_apt=0
fi
command -v apt-get >/dev/null 2>&1 || may_apt=0
if [ ${#missing[@]} -gt 0 ]; then  # required: install them, or stop with the command
  if [ "$(id -u)" -ne 0 ] && [ ${#sudo[@]} -eq 0 ]; then
    echo "relakit: error: ${missing[*]} missing (Debian packages: ${packages[*]}); install them with: sudo apt-get install ${packages[*]}" >&2
    exit 1
  elif [ "$may_apt" -eq 0 ]; then
    echo "relakit: error: ${missing[*]} missing and no apt-get here; install Prometheus 2.x (prometheus, promtool), wrk and Chromium with its chromedriver so that they are on PATH" >&2
    exit 1
  fi
  echo "relakit: installing Debian's ${packages[*]} (${missing[*]} missing)" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  for prog in "${missing[@]}"; do
    command -v "$prog" >/dev/null 2>&1 || {
      echo "relakit: error: installed '${package[$prog]}' but '$prog' is still not on PATH" >&2; exit 1; }
  done
fi
# wanted: a speed-up, not a need. Any failure (no apt, no network, no such package) only
# leaves .venv on python3 from PATH, and says so
if [ ${#wanted[@]} -gt 0 ] && [ "$may_apt" -eq 1 ]; then
  echo "relakit: installing Debian's ${wanted[*]} (for .venv on $DISTRO_PYTHON)" >&2
  export DEBIAN_FRONTEND=noninteractive
  { "${sudo[@]}" apt-get update -qq && \
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null; } \
    || echo "relakit: could not install ${wanted[*]}; .venv will be made on python3 from PATH" >&2
fi
