"""RelA live: real services, a real Prometheus, relakit's control plane unchanged.

:class:`Lab` starts, on 127.0.0.1 only: a config server, ``instances`` data-plane
services, and Prometheus (Debian's ``/usr/bin/prometheus``) scraping them on the
clocks' scrape interval. The :class:`Agent` is the same
:class:`~relakit.control.Controller` the simulator drives, reading what
Prometheus holds (an instant query of a range selector returns the raw scraped
samples, which the trace importer turns into a TSDB) and asserting its
decisions to the config server. :func:`run_load` is an open-loop load
generator (tiers, a rate step, hedging when the flag says so). ``record``
saves what Prometheus scraped in the importer's format, for replay. Every
process is stopped on :meth:`Lab.down` (or leaving the ``with`` block).

How a lab is stopped even when its owner was killed, and where the token travels: :mod:`.lab`.

Modules: :mod:`.lifecycle` (what ``relakit lab up|load|record|down`` does: the command
line only parses its arguments), :mod:`.lab` (the processes, queries, recording, ``stop_lab``),
:mod:`.agent` (the deciders live), :mod:`.load` (the load generator), :mod:`.calls`
(what it shares with the front: outcomes, the polled state, the throttle),
:mod:`.config_server` and :mod:`.dataplane` (the services), :mod:`.procs`
(process records). The names above are loaded when first asked for.
"""

from importlib import import_module

_LAZY = {"Lab": "relakit.lab.lab", "LabSpec": "relakit.lab.lab", "free_port": "relakit.lab.lab",
         "running": "relakit.lab.lab", "stop_lab": "relakit.lab.lab",
         "Agent": "relakit.lab.agent", "run_load": "relakit.lab.load"}


def __getattr__(name: str):  # PEP 562: a service started with -m loads none of this
    if name not in _LAZY:
        raise AttributeError(f"module 'relakit.lab' has no attribute {name!r}")
    return getattr(import_module(_LAZY[name]), name)


__all__ = sorted(_LAZY)
