"""The set-up's choice of interpreter for .venv (tools/venv-python.sh): the distribution's
python3 when it is 3.11+ with venv and headers, else python3 from PATH; the venv is left
alone while the choice stands and re-made when it changes (the Makefile re-installs the
packages exactly then, through .venv/.base)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "venv-python.sh"
# the interpreter this test runs on (the one .venv was made on): 3.11+, venv, headers
REAL = os.path.realpath(sys._base_executable)


def _wrapper(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _make(venv: Path, distro: Path, path_python3: str, *extra: str):
    """tools/venv-python.sh VENV with the distribution's python3 at ``distro`` and PATH's
    python3 doing ``path_python3``."""
    bindir = venv.parent / "bin"
    bindir.mkdir(exist_ok=True)
    _wrapper(bindir / "python3", path_python3)
    env = dict(os.environ, RELAKIT_DISTRO_PYTHON=str(distro),
               PATH=f"{bindir}:/usr/bin:/bin")
    return subprocess.run(["bash", str(SCRIPT), str(venv), *extra], env=env,
                          capture_output=True, text=True, timeout=120)


def test_venv_goes_on_the_distribution_python_when_it_has_venv_and_headers(tmp_path):
    distro = _wrapper(tmp_path / "distro-python3", f'exec {REAL} "$@"')
    venv = tmp_path / "venv"
    done = _make(venv, distro, "exit 1")  # (PATH's python3 would fail: not asked)
    assert done.returncode == 0, done.stderr
    assert (venv / ".base").read_text().strip() == REAL
    assert subprocess.run([venv / "bin" / "python", "-c", "import venv"]).returncode == 0

    # the choice stands: the venv is left alone (the packages are not installed again)
    (venv / "marker").write_text("kept")
    again = _make(venv, distro, "exit 1")
    assert again.returncode == 0 and (venv / "marker").exists() and not again.stderr

    # made on another interpreter (as before this choice existed): re-made, and said so
    (venv / ".base").write_text("/somewhere/else/python3.11\n")
    remade = _make(venv, distro, "exit 1")
    assert remade.returncode == 0, remade.stderr
    assert not (venv / "marker").exists() and (venv / ".base").read_text().strip() == REAL
    assert "re-making" in remade.stderr and "/somewhere/else/python3.11" in remade.stderr


def test_venv_falls_back_to_python3_on_path_without_a_usable_distribution_python(tmp_path):
    too_old = _wrapper(tmp_path / "distro-python3",  # (a Python 3.9, say: fails the check)
                       'case "$1" in -c) exit 1;; esac; exit 1')
    venv = tmp_path / "venv"
    done = _make(venv, too_old, f'exec {REAL} "$@"')
    assert done.returncode == 0, done.stderr
    assert (venv / ".base").read_text().strip() == REAL
    # and an interpreter named on the command line (make PY=...) wins over both
    named = _make(tmp_path / "venv2", too_old, "exit 1", REAL)
    assert named.returncode == 0, named.stderr
    assert (tmp_path / "venv2" / ".base").read_text().strip() == REAL


def test_a_named_interpreter_that_is_no_python_311_is_refused_in_one_line(tmp_path):
    distro = _wrapper(tmp_path / "distro-python3", f'exec {REAL} "$@"')
    for bad in ("/no/such/python3", str(_wrapper(tmp_path / "old-python", "exit 1"))):
        done = _make(tmp_path / "venv", distro, "exit 1", bad)
        assert done.returncode == 1
        assert done.stderr.strip() == (f"relakit: error: PY={bad} is not a Python 3.11 or newer; "
                                       "name one with make PY=/path/to/python3")
        assert not (tmp_path / "venv").exists()


def test_without_any_python_311_the_set_up_says_so_in_one_line(tmp_path):
    too_old = _wrapper(tmp_path / "distro-python3", "exit 1")
    done = _make(tmp_path / "venv", too_old, "exit 1")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"relakit: error: no Python 3.11 or newer found ({too_old} with venv and headers, or "
        "python3 on PATH); name one with make PY=/path/to/python3")
    assert not (tmp_path / "venv").exists()


def test_a_failing_apt_for_the_wanted_python_packages_does_not_stop_the_set_up(tmp_path):
    """python3-dev is a speed-up (tools/system-packages.sh): with Prometheus there and apt
    failing (no network, say), the set-up goes on, saying .venv will use PATH's python3."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for prog in ("prometheus", "promtool", "wrk"):
        _wrapper(bindir / prog, "exit 0")
    apt_log = tmp_path / "apt.log"
    _wrapper(bindir / "apt-get", f'echo "$@" >> {apt_log}; exit 100')
    no_headers = _wrapper(tmp_path / "distro-python3",  # (3.11+ with venv, but no Python.h)
                          f'case "$2" in *Python.h*) exit 1;; esac; exec {REAL} "$@"')
    env = dict(os.environ, RELAKIT_DISTRO_PYTHON=str(no_headers), PATH=f"{bindir}:/usr/bin:/bin")
    done = subprocess.run(["bash", str(ROOT / "tools" / "system-packages.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if os.geteuid() == 0:  # (may install: it tried, failed, and said so)
        assert apt_log.read_text().splitlines()[0] == "update -qq"
        said = "could not install python3-dev; .venv will be made on python3 from PATH"
        assert said in done.stderr


def test_without_root_a_missing_browser_stops_the_test_set_up_only(tmp_path):
    """`make test` needs Chromium and chromedriver (tests/test_browser.py); `make lab` and
    `make run` do not. A user without root or sudo is told both packages and the command
    by --browser, and the plain set-up goes on."""
    import shutil

    bindir = tmp_path / "bin"  # PATH: these, and only the tools the script calls
    bindir.mkdir()
    for prog in ("prometheus", "promtool", "wrk"):
        _wrapper(bindir / prog, "exit 0")
    _wrapper(bindir / "id", "echo 1000")  # not root
    _wrapper(bindir / "sudo", "exit 1")  # and no passwordless sudo
    for tool in ("bash", "dirname", "cat", "grep", "sed", "head", "cut"):
        (bindir / tool).symlink_to(shutil.which(tool))
    distro = _wrapper(tmp_path / "distro-python3", f'exec {REAL} "$@"')
    env = dict(os.environ, RELAKIT_DISTRO_PYTHON=str(distro), PATH=str(bindir))

    def run(*args):
        return subprocess.run(["bash", str(ROOT / "tools" / "system-packages.sh"), *args],
                              env=env, capture_output=True, text=True, timeout=60)

    plain, browser = run(), run("--browser")
    assert plain.returncode == 0, plain.stderr
    assert browser.returncode == 1
    assert browser.stderr.strip() == (
        "relakit: error: chromium chromedriver missing (Debian packages: chromium "
        "chromium-driver); install them with: sudo apt-get install chromium chromium-driver")
