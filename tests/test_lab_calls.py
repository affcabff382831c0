"""What the lab's front and its load generator share (relakit/lab/calls.py): one outcome
map, one reader of the config server's state, one throttle in front of a call — tested
here on the decision path both take, with no lab running."""

from __future__ import annotations

import asyncio
import types

import httpx
import pytest

from relakit.lab import calls, front, load
from relakit.lab.calls import (
    NO_INSTANCE,
    QUEUE_FULL,
    THROTTLED,
    outcome_of,
    read_state,
    through_throttle,
)
from relakit.lab.front import Front, make_app
from relakit.lab.in_path import ClientThrottle
from relakit.vocab import OUTCOMES, POLICY_FLAGS


def test_every_answer_has_the_outcome_the_simulator_counts():
    # what relakit.lab.dataplane and the front answer, and how the kernel counts each
    answers = {(200, b"ok"): "ok", (500, b"error"): "error", (504, b"deadline"): "timeout",
               (503, b"shed"): "dropped", QUEUE_FULL: "error", NO_INSTANCE: "error",
               (429, b"rejected"): "rejected", THROTTLED: "throttled",
               (502, b"instance 0: ConnectionRefusedError"): "error"}
    for answer, outcome in answers.items():
        assert outcome_of(*answer) == outcome, answer
    assert set(answers.values()) <= set(OUTCOMES)
    # both clients count with this one map (neither keeps a copy of its own)
    assert front.outcome_of is load.outcome_of is calls.outcome_of


def test_the_state_gives_the_flags_and_the_routable_instances():
    flags = {"hedge_enabled": False, "throttle_k": None}
    state = {"flags": {"hedge_enabled": True, "throttle_k": 3.0},
             "instances": {"1": {"routable": False}, "2": {"routable": True}}}
    assert read_state(state, 4, flags) == [0, 2, 3]
    assert flags == {"hedge_enabled": True, "throttle_k": 3.0}
    assert read_state({"flags": {}}, 2, flags) == [0, 1]  # no controls: every instance
    for bad in ([], {"flags": []}, {"instances": {"x": {"routable": False}}}):
        with pytest.raises(ValueError):
            read_state(bad, 2, flags)
    assert flags["throttle_k"] == 3.0  # a bad state changed nothing
    f = Front(["http://a", "http://b", "http://c"])
    f.apply_state(state)
    assert f.routable == [0, 2] and f.flags["hedge_enabled"] is True


def _gauges(client) -> dict[str, float]:
    """An instance's flag and concurrency-limit gauges, from its ``/metrics``."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(("flag{", "concurrency_limit ")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_every_reader_of_the_state_reads_and_refuses_it_alike():
    """The instances (relakit.lab.dataplane), the front and the load generator read the
    config server's state with one reader: a policy flag that is not a bool ("false"
    would read as True) or any other malformed state is refused whole by all three (the last one
    stays, the poller goes on) — an instance once died polling a state that was a list."""
    from fastapi.testclient import TestClient

    from relakit.lab.dataplane import make_app as instance_app

    app = instance_app("http://config", 1.0, servers=1, mean_ms=1, slow_ms=1,
                       slow_fraction=0.0, error_rate=0.0, token="t",
                       concurrency_limit={"initial": 20.0, "max": 50.0})
    instance = TestClient(app)  # not entered: no poller of its own; we poll for it
    fr = Front(["http://a", "http://b"])
    load_flags = {"hedge_enabled": False, "throttle_k": None}  # as relakit.lab.load starts
    good = {"flags": {"hedge_enabled": True, "shed_bronze": True, "degraded_mode": False,
                      "throttle_k": 3, "concurrency_max": 4.0},
            "instances": {"1": {"routable": False}}}
    bad = ([], {"flags": []},
           {"flags": {"shed_bronze": False}, "instances": {"x": {"routable": False}}},
           {"flags": {"shed_bronze": False, "concurrency_max": 0.5}},
           {"flags": {"shed_bronze": False, "throttle_k": "3"}},
           {"flags": {"shed_bronze": "false"}}, {"flags": {"hedge_enabled": 0}})
    readers = {"instance": app.state.apply_state, "front": fr.apply_state,
               "load": lambda state: read_state(state, 2, load_flags)}
    served = [good, *bad]

    async def poll_all():
        """Each reader polls the same states in turn through calls.keep_polling."""
        seen = {name: [] for name in readers}

        def handler(request):
            return httpx.Response(200, json=served[min(len(log), len(served) - 1)])

        log: list = []
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            for name, apply in readers.items():
                log.clear()

                def applied(state, apply=apply, name=name):
                    log.append(state)
                    apply(state)  # raises on a malformed state: keep_polling goes on
                    seen[name].append(len(log))

                task = asyncio.create_task(calls.keep_polling(client, "http://config",
                                                              applied, 0.0))
                while len(log) < len(served) + 1:  # every state, and one poll after
                    assert not task.done(), f"{name}'s poller stopped"
                    await asyncio.sleep(0)
                task.cancel()
        return seen

    seen = asyncio.run(poll_all())
    assert seen == {name: [1] for name in readers}  # the good state only, for each
    # the flags as served, for every reader
    assert fr.flags == {"hedge_enabled": True, "throttle_k": 3, "shed_bronze": True,
                        "degraded_mode": False, "concurrency_max": 4.0}
    assert load_flags == fr.flags and fr.routable == [0]
    assert all(type(load_flags[k]) is bool for k in POLICY_FLAGS)
    # the instance applies what it read, and the malformed states after it changed nothing
    assert _gauges(instance) == {'flag{flag="hedge_enabled"}': 1.0,
                                 'flag{flag="shed_bronze"}': 1.0,
                                 'flag{flag="degraded_mode"}': 0.0, "concurrency_limit": 4.0}
    shed = instance.get("/work", params={"tier": "bronze"})
    assert (shed.status_code, shed.text) == (503, "shed")
    for state in bad:
        assert not asyncio.run(calls.refresh(_Serving(state), "http://config",
                                             app.state.apply_state))
    assert _gauges(instance)["concurrency_limit"] == 4.0
    app.state.apply_state({"flags": {"shed_bronze": False, "concurrency_max": None}})
    assert _gauges(instance) == {'flag{flag="hedge_enabled"}': 1.0,
                                 'flag{flag="shed_bronze"}': 0.0,
                                 'flag{flag="degraded_mode"}': 0.0, "concurrency_limit": 4.0}
    assert instance.get("/work", params={"tier": "bronze"}).status_code == 200


class _Serving:
    """A client whose ``get`` answers ``state`` (for :func:`calls.refresh`)."""

    def __init__(self, state):
        self.state = state

    async def get(self, url):
        return httpx.Response(200, json=self.state)


class _Draw:
    """A throttle's random source that returns ``u`` (and says whether it was asked)."""

    def __init__(self, u: float):
        self.u, self.asked = u, 0

    def random(self) -> float:
        self.asked += 1
        return self.u


def _throttle(requests: int, accepts: int, k: float, u: float) -> ClientThrottle:
    """A throttle whose window holds ``requests`` and ``accepts`` in its bucket at t = 0."""
    th = ClientThrottle(k=k, window_s=10.0)
    th.req[0], th.acc[0], th.requests, th.accepts = requests, accepts, requests, accepts
    th.rng = _Draw(u)
    return th


def _call(th, k, monkeypatch, answer=(200, b"ok")):
    """One call through :func:`through_throttle` at t = 0.5 s: (its answer, whether it
    was sent)."""
    monkeypatch.setattr(calls, "time", types.SimpleNamespace(monotonic=lambda: 0.5))
    sent = []

    async def send():
        sent.append(True)
        return answer

    return asyncio.run(through_throttle(th, k, send)), bool(sent)


@pytest.mark.parametrize("k, p", [(None, 60 / 101), (2.0, 60 / 101), (3.0, 40 / 101)])
def test_a_call_is_refused_exactly_below_the_sre_probability(monkeypatch, k, p):
    """100 requests and 20 accepts in the window: refused with probability
    (requests - k accepts) / (requests + 1), k the scenario's 2 or a policy's throttle_k."""
    th = _throttle(100, 20, 2.0, p - 1e-9)
    assert _call(th, k, monkeypatch) == (THROTTLED, False)  # refused: never sent
    assert (th.requests, th.accepts, th.throttled) == (101, 20, 1)
    th = _throttle(100, 20, 2.0, p + 1e-9)
    assert _call(th, k, monkeypatch) == ((200, b"ok"), True)
    assert (th.requests, th.accepts, th.throttled) == (101, 21, 0)  # sent and accepted


def test_no_draw_while_accepts_cover_requests_and_only_answers_count_as_accepts(monkeypatch):
    th = _throttle(100, 50, 2.0, 0.0)  # p = (100 - 100) / 101 = 0: a draw of 0 would refuse
    assert _call(th, None, monkeypatch) == ((200, b"ok"), True)
    assert th.rng.asked == 0
    for answer, accepted in (((500, b"error"), 1), ((503, b"shed"), 0), ((504, b"x"), 0),
                             ((429, b"rejected"), 0)):
        th = _throttle(0, 0, 2.0, 0.5)
        assert _call(th, None, monkeypatch, answer) == (answer, True)
        assert th.accepts == accepted, answer


def test_the_refusal_frequency_is_the_sre_probability(monkeypatch):
    """With its own random draws: 3,000 throttles each judge one call in the state
    above; the share refused is 60 / 101 within four standard errors (0.036)."""
    n, refused = 3000, 0
    for seed in range(n):
        th = _throttle(100, 20, 2.0, 0.0)
        th.rng = ClientThrottle(k=2.0, window_s=10.0, seed=seed).rng
        refused += _call(th, None, monkeypatch)[0] == THROTTLED
    p = 60 / 101
    assert abs(refused / n - p) <= 4 * (p * (1 - p) / n) ** 0.5, refused / n


def test_the_front_counts_a_call_with_no_routable_instance_an_error():
    f = Front(["http://127.0.0.1:9"])
    handle = make_app(f, "http://127.0.0.1:9", 1.0, client_throttle={"k": 2.0, "window_s": 5.0})
    f.routable = []
    assert asyncio.run(handle(b"GET", b"/work?tier=gold", {})) == NO_INSTANCE
    status, text = handle(b"GET", b"/metrics", {})
    assert status == 200
    assert b'client_requests_total{tier="gold",outcome="error"} 1' in text
    assert text.count(b"} 1\n") == 1  # that call, and only there


def test_a_load_draws_a_fresh_seed_unless_given_one(monkeypatch):
    """`lab load` twice on one lab: two independent arrival streams (the instances' service
    times are drawn afresh per lab: LabSpec.seed); a given seed is kept."""
    seen = []

    async def fake_load(lab, phases, tiers, hedge_delay_s, timeout_s, seed, fanout=1):
        seen.append(seed)
        return []

    monkeypatch.setattr(load, "_load", fake_load)
    for seed in (None, None, 7):
        load.run_load(None, [(1.0, 1.0)], seed=seed)
    assert seen[0] != seen[1] and seen[2] == 7 and all(isinstance(x, int) for x in seen)


def test_lab_load_prints_the_seed_it_drew_and_keeps_one_given(monkeypatch, tmp_path, capsys):
    """`relakit lab load` without --seed draws one and prints it; --seed N is used as given
    (the load's draws are repeatable like the instances' service times)."""
    from relakit.lab import lab as lab_module
    from relakit.lab import lifecycle

    used = []

    def fake_run_load(lab, phases, seed=None, **_):
        used.append(seed)
        return [{"start_s": 0.0, "tier": "gold", "outcome": "ok", "latency_ms": 1.0,
                 "hedged": False, "instance": 0}]

    monkeypatch.setattr(lifecycle, "_require_running", lambda work: None)
    monkeypatch.setattr(lab_module.Lab, "attach", classmethod(lambda cls, work: None))
    monkeypatch.setattr(load, "run_load", fake_run_load)
    assert lifecycle.load(tmp_path, [(1.0, 1.0)]) == 0
    drawn = int(capsys.readouterr().out.split("seed ", 1)[1].split()[0])
    assert used == [drawn]
    assert lifecycle.load(tmp_path, [(1.0, 1.0)], seed=7) == 0
    assert used[-1] == 7 and "seed 7" not in capsys.readouterr().out


def test_an_instance_polls_its_config_while_it_runs_and_stops_on_shutdown(monkeypatch):
    """The data plane's poller lives in the app's lifespan (FastAPI's on_event is
    deprecated): entering the app starts it, it applies what it reads, and shutdown
    cancels it and waits for it, so no poll outlives the instance."""
    import time
    import warnings

    from fastapi.testclient import TestClient

    from relakit.lab import dataplane

    polls: list = []

    def handler(request):
        polls.append(request.url)
        return httpx.Response(200, json={"flags": {"shed_bronze": True}})

    real = httpx.AsyncClient
    monkeypatch.setattr(dataplane.httpx, "AsyncClient",
                        lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # no deprecated start-up hook
        app = dataplane.make_app("http://config", 0.01, servers=1, mean_ms=1, slow_ms=1,
                                 slow_fraction=0.0, error_rate=0.0)
    with TestClient(app) as instance:
        task = app.state.poller
        deadline = time.monotonic() + 10.0
        while _gauges(instance).get('flag{flag="shed_bronze"}') != 1.0:
            assert time.monotonic() < deadline and not task.done(), "the poller never applied"
            time.sleep(0.01)
        assert instance.get("/work", params={"tier": "bronze"}).status_code == 503
    assert task.cancelled(), task  # stopped with the app, not left pending
    seen = len(polls)
    time.sleep(0.1)
    assert len(polls) == seen >= 1  # nothing polls after shutdown
    assert str(polls[0]).startswith("http://config")
