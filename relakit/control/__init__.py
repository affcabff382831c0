"""The control plane: clocks, signals over sampled metrics, a priority policy with
hysteresis, and the audit log. It never imports the kernel or the chain: it sees
only what Prometheus would hold (:class:`TSDB`), in simulation, in replay and live.

Replay and threshold sweeps live above it, in :mod:`relakit.openloop`
(``relakit.replay``): they wire the policy, the chain and traces.
"""

_NAMES = {  # name: the module defining it, imported when the name is first asked for
    "format_audit": "audit", "Clocks": "clocks", "load_clocks": "clocks",
    "Controller": "controller", "signal_matrix": "controller", "Policy": "policy",
    "load_policy": "policy", "Signal": "signals", "TSDB": "tsdb", "Target": "tsdb",
}


def __getattr__(name: str):
    """The package's names, each imported when first asked for (PEP 562): a run of the
    data plane alone reads ``relakit.control.faults`` and ``relakit.control.clocks``
    and never pays for the policy, signals and audit (~20 ms of a fresh process)."""
    from importlib import import_module

    if name not in _NAMES:
        raise AttributeError(f"module 'relakit.control' has no attribute {name!r}")
    value = getattr(import_module(f"relakit.control.{_NAMES[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "TSDB",
    "Clocks",
    "Controller",
    "Policy",
    "Signal",
    "Target",
    "format_audit",
    "load_clocks",
    "load_policy",
    "signal_matrix",
]
