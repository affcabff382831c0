"""The control plane: clocks, signals over sampled metrics, a priority policy with
hysteresis, and the audit log. It never imports the kernel: it sees only what
Prometheus would hold (:class:`TSDB`), in simulation, in replay and live.
"""

from relakit.control.clocks import Clocks, load_clocks
from relakit.control.controller import (
    Controller,
    ReplayResult,
    format_audit,
    replay,
    signal_matrix,
    sweep_thresholds,
)
from relakit.control.policy import Policy, load_policy
from relakit.control.signals import Signal
from relakit.control.tsdb import TSDB, Target

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
