# What an interpreter offers for making .venv on it: shell functions that
# tools/venv-python.sh and tools/system-packages.sh share (source this file).
# RELAKIT_DISTRO_PYTHON names the distribution's interpreter (/usr/bin/python3 by
# default; the set-up's tests point it elsewhere).
DISTRO_PYTHON=${RELAKIT_DISTRO_PYTHON:-/usr/bin/python3}

py_is_311() {  # Python 3.11 or newer
  [ -x "$1" ] || command -v "$1" >/dev/null 2>&1 || return 1
  "$1" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null
}
py_has_venv() {  # can make a venv with pip (Debian splits both into python3-venv)
  "$1" -c 'import ensurepip, venv' 2>/dev/null
}
py_has_headers() {  # has Python.h (the ahead-of-time build compiles against it)
  "$1" -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null
}
