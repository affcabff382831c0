"""Closed-form reliability and queueing results (numpy/scipy only; no simulator imports).

Rates are per second and times in seconds. Use these as ground truth for the simulator and
as quick back-of-envelope answers: fan-out success and tail amplification
(:mod:`.fanout`), M/M/c, M/G/1 and G/G/c waiting times (:mod:`.queueing`), the finite-source
queue M/M/c//N of a closed client population (:mod:`.finite_source`), the clock bound
(:mod:`.clocks`), the in-path mechanisms' steady states (:mod:`.in_path`), the detection
delay of correctness probes (:mod:`.probes`) and a CTMC of
one node with timeouts and retries for metastability's long horizons (:mod:`.retry_ctmc`).
"""

from .clocks import DelayDistribution, min_detectable_spike, step_delay
from .fanout import fanout_success, prob_any_slow, quorum_success, slowest_of_n_quantile
from .finite_source import FiniteSource, finite_source
from .in_path import ThrottleSteadyState, decision_capacity, throttle_steady_state
from .probes import ProbeDetection, probe_cost, probe_detection, wrong_before_isolation
from .queueing import (
    MMc,
    UnstableSystemError,
    erlang_c,
    kingman_wait,
    mg1_mean_response,
    mg1_mean_wait,
    mm1,
    mmc,
    service_moments,
    service_quantile,
)
from .retry_ctmc import RetryCTMC, RetryCTMCWarning, retry_ctmc, retry_generator

__all__ = [
    "DelayDistribution",
    "ThrottleSteadyState",
    "decision_capacity",
    "throttle_steady_state",
    "FiniteSource",
    "finite_source",
    "min_detectable_spike",
    "step_delay",
    "ProbeDetection",
    "RetryCTMC",
    "RetryCTMCWarning",
    "retry_ctmc",
    "retry_generator",
    "probe_cost",
    "probe_detection",
    "wrong_before_isolation",
    "MMc",
    "UnstableSystemError",
    "erlang_c",
    "fanout_success",
    "kingman_wait",
    "mg1_mean_response",
    "mg1_mean_wait",
    "mm1",
    "mmc",
    "prob_any_slow",
    "quorum_success",
    "service_moments",
    "service_quantile",
    "slowest_of_n_quantile",
]
