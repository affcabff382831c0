"""The control plane: clocks, signals over sampled metrics, a priority policy with
hysteresis, and the audit log. It never imports the kernel or the chain: it sees
only what Prometheus would hold (:class:`TSDB`), in simulation, in replay and live.

Replay and threshold sweeps live in :mod:`relakit.replay` (they wire the policy,
the chain and traces); ``relakit.control.replay``, ``sweep_thresholds`` and
``ReplayResult`` stay importable from here for the README's and notebooks' sake,
resolved only when asked for (PEP 562), so the control plane itself never loads them.
"""

_NAMES = {  # name: the module defining it, imported when the name is first asked for
    "format_audit": "audit", "Clocks": "clocks", "load_clocks": "clocks",
    "Controller": "controller", "signal_matrix": "controller", "Policy": "policy",
    "load_policy": "policy", "Signal": "signals", "TSDB": "tsdb", "Target": "tsdb",
}
_FROM_REPLAY = ("ReplayResult", "replay", "sweep_thresholds")


def __getattr__(name: str):
    """The package's names, each imported when first asked for (PEP 562): a run of the
    data plane alone reads ``relakit.control.faults`` and ``relakit.control.clocks``
    and never pays for the policy, signals and audit (~20 ms of a fresh process)."""
    from importlib import import_module

    if name in _NAMES:
        value = getattr(import_module(f"relakit.control.{_NAMES[name]}"), name)
    elif name in _FROM_REPLAY:  # a re-export, not a dependency: see the module docstring
        import relakit.replay as _replay

        value = getattr(_replay, name) if name != "replay" else _replay.replay
    else:
        raise AttributeError(f"module 'relakit.control' has no attribute {name!r}")
    if name not in _FROM_REPLAY:  # relakit.control.replay stays the function, not the module
        globals()[name] = value
    return value


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
