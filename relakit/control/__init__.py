"""The control plane: clocks, signals over sampled metrics, a priority policy with
hysteresis, and the audit log. It never imports the kernel or the chain: it sees
only what Prometheus would hold (:class:`TSDB`), in simulation, in replay and live.

Replay and threshold sweeps live in :mod:`relakit.replay` (they wire the policy,
the chain and traces); ``relakit.control.replay``, ``sweep_thresholds`` and
``ReplayResult`` stay importable from here for the README's and notebooks' sake,
resolved only when asked for (PEP 562), so the control plane itself never loads them.
"""

from relakit.control.audit import format_audit
from relakit.control.clocks import Clocks, load_clocks
from relakit.control.controller import Controller, signal_matrix
from relakit.control.policy import Policy, load_policy
from relakit.control.signals import Signal
from relakit.control.tsdb import TSDB, Target

_FROM_REPLAY = ("ReplayResult", "replay", "sweep_thresholds")


def __getattr__(name: str):  # a re-export, not a dependency: see the module docstring
    if name in _FROM_REPLAY:
        import relakit.replay as _replay

        return getattr(_replay, name) if name != "replay" else _replay.replay
    raise AttributeError(f"module 'relakit.control' has no attribute {name!r}")


__all__ = [
    "TSDB",
    "Clocks",
    "Controller",
    "Policy",
    "ReplayResult",
    "Signal",
    "Target",
    "format_audit",
    "load_clocks",
    "load_policy",
    "replay",
    "signal_matrix",
    "sweep_thresholds",
]
