#!/usr/bin/env bash
# Makes .venv on the interpreter relakit runs fastest on, and re-makes it when that choice
# changes. Usage: tools/venv-python.sh VENV [PYTHON]
#
# Why: most of a cold start, a chain run and the test suite is Python running (numba's
# compiler is Python; so are the control plane and the notebooks). Distributions build their
# python3 with profile-guided and link-time optimisation; pyenv's and a plain ./configure's
# default builds have neither. Measured here (2-core VM, Debian 12's 3.11.2 against pyenv's
# 3.11.7, same packages): numba compiling the plain loop from nothing 10.4-10.5 -> 8.1-8.8 s,
# warm start 0.48 -> 0.31-0.38 s, a chain-heterogeneous run 2.85 -> 2.4-2.6 s.
#
# The choice: PYTHON when given (make PY=...); else the distribution's python3 (python-checks.sh) when
# it is 3.11 or newer and has venv and its C headers (the ahead-of-time build compiles
# against them: tools/system-packages.sh installs them when it may); else python3 on PATH.
# The venv is touched only when it is missing or made on another interpreter, so that a
# Makefile rule depending on VENV/.base re-installs the packages exactly then.
set -euo pipefail
. "$(dirname "$0")/python-checks.sh"
venv=$1
want=${2:-}
if [ -z "$want" ]; then
  if py_is_311 "$DISTRO_PYTHON" && py_has_venv "$DISTRO_PYTHON" && py_has_headers "$DISTRO_PYTHON"; then
    want=$DISTRO_PYTHON
  else
    want=python3
  fi
fi
if ! py_is_311 "$want"; then
  if [ -n "${2:-}" ]; then  # named on the command line
    echo "relakit: error: PY=$want is not a Python 3.11 or newer; name one with make PY=/path/to/python3" >&2
  else
    echo "relakit: error: no Python 3.11 or newer found ($DISTRO_PYTHON with venv and headers, or python3 on PATH); name one with make PY=/path/to/python3" >&2
  fi
  exit 1
fi
exe=$("$want" -c 'import os, sys; print(os.path.realpath(sys.executable))')
if [ -f "$venv/.base" ] && [ "$(cat "$venv/.base")" = "$exe" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
if [ -e "$venv" ]; then
  echo "relakit: re-making $venv on $exe (it was made on $(cat "$venv/.base" 2>/dev/null || grep '^executable' "$venv/pyvenv.cfg" 2>/dev/null | cut -d' ' -f3 || echo 'an unknown interpreter'))" >&2
  rm -rf "$venv"
fi
"$exe" -m venv "$venv" || { rm -rf "$venv"; exit 1; }  # (no half-made venv left behind)
echo "$exe" > "$venv/.base"
