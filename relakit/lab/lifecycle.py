"""The live lab's life, as ``relakit lab up|load|record|down`` runs it.

The command line parses the arguments and calls one function here; each validates what
only the lab knows (a policy against the clocks, a lease against its renewal), does its
part and prints what the user needs to go on (the URLs, where the audit went, what was
stopped). The processes themselves are :class:`relakit.lab.lab.Lab`'s.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from relakit.validate import ScenarioError


def up(work: Path, *, policy: str | None, chain: str | None, instances: int, agents: int,
       lease_s: float, renew_s: float, clocks: dict, front: dict | None = None,
       mitigations: str | None = None) -> int:
    """Start the lab in ``work`` and its agents (``policy`` None: the chain alone), run
    until Ctrl-C or SIGTERM (``down``), then stop it and write the agents' audit.
    ``front``: LabSpec's front-door keys (port, routing, tier header, keep-alive, queue
    limit, deadline, buckets); None values keep LabSpec's defaults. ``mitigations``: a
    scenario YAML whose ``mitigations.client_throttle`` and ``.concurrency_limit`` the lab
    runs (any other mitigation in it is refused by name)."""
    import polars as pl

    from relakit.checks import check_lab, check_local_flags, enforce
    from relakit.control import load_clocks, load_policy
    from relakit.io import write_parquet
    from relakit.lab.dataplane import DEFAULT_BUCKETS_S
    from relakit.lab.in_path import lab_mitigations
    from relakit.lab.lab import Lab, LabSpec

    if policy is None and chain is None:
        raise ScenarioError("lab up: --no-policy needs --chain (the agent needs a "
                            "policy, a chain, or both)")
    pol = None if policy is None else load_policy(policy)
    if chain is not None:
        from relakit.chain import load_chain

        load_chain(chain)  # a bad chain is refused before anything starts
    front = {k: v for k, v in (front or {}).items() if v is not None}
    mit = {} if mitigations is None else lab_mitigations(mitigations)
    if pol is not None:  # a policy's local flag needs its mechanism here too
        enforce(check_local_flags(_LabScenario(pol, mit, mitigations or "--mitigations")))
        enforce(check_lab(pol, load_clocks({}, **clocks),
                          buckets_s=front.get("buckets_s", DEFAULT_BUCKETS_S),
                          extra_series=("rejected_total", "concurrency_limit")
                          if "concurrency_limit" in mit else (), mechanisms=tuple(mit)))
    if lease_s <= renew_s:
        raise ScenarioError(f"lab up: --lease-s {lease_s:g} must be longer than "
                            f"--renew-s {renew_s:g} (a leader renews its lease "
                            "before it expires)")
    if mitigations is not None:  # said, never silent: the file's other keys are not the lab's
        print(f"lab up: from {mitigations}: {', '.join(mit) or 'no in-path mitigation'}; "
              "its fleet, workload and faults are not read (the lab's options set those)",
              flush=True)
    work.mkdir(parents=True, exist_ok=True)
    spec = LabSpec(instances=instances, clocks=clocks, lease_s=lease_s, renew_s=renew_s,
                   mitigations=mit, **front)
    names = [f"agent{i}" for i in range(agents)]
    with Lab(spec, workdir=str(work)) as lab:
        for name in names:  # each a process of its own: one crash takes one agent down
            (work / f"decisions-{name}.parquet").unlink(missing_ok=True)
            lab.start_agent(name, policy, chain, ha=agents > 1)
        ha = f"; {agents} agents, lease {lease_s:g} s" if agents > 1 else ""
        print(f"lab up: front {lab.front_url}/work (tier in the {spec.tier_header} header "
              f"or ?tier=; routing {spec.routing}; URLs in {work / 'endpoints.json'}), "
              f"config {lab.config_url}, prometheus {lab.prom_url}, instances "
              f"{', '.join(lab.instance_urls)}{ha}; Ctrl-C or "
              f"`relakit lab down --dir {work}`", flush=True)
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        exited: set[str] = set()
        try:
            while not stop:
                time.sleep(0.5)
                for name in names:  # an agent that died is said once; the others go on
                    code = lab.named[name].poll()
                    if code is not None and name not in exited:
                        exited.add(name)
                        print(f"{name} exited (status {code}); see {work / name}.log",
                              flush=True)
        except KeyboardInterrupt:
            pass
        lab.stop_agents()
        audits = {n: work / f"decisions-{n}.parquet" for n in names}
        missing = [n for n, p in audits.items() if not p.is_file()]
        if missing:  # a killed agent writes nothing; the config server's history remains
            print(f"no audit from {', '.join(missing)} (killed before it could write one)")
        found = [pl.read_parquet(p) for p in audits.values() if p.is_file()]
        final = work / "decisions.parquet"
        final.unlink(missing_ok=True)  # never an earlier lab's audit beside this one's
        if found:
            write_parquet(pl.concat(found).sort("decided_at_s", maintain_order=True), final)
        for p in audits.values():
            p.unlink(missing_ok=True)
    print(f"lab down; audit in {final}" if found else "lab down; no audit written")
    return 0


class _LabScenario:
    """What :func:`relakit.checks.check_local_flags` reads of a scenario, for the lab:
    its policy, the in-path mechanisms it runs, the file they came from."""

    def __init__(self, policy, mitigations: dict, source: str):
        from types import SimpleNamespace

        self.policy, self.source = policy, source
        self.mitigations = SimpleNamespace(**{k: mitigations.get(k) for k in (
            "client_throttle", "concurrency_limit")})


def down(work: Path) -> int:
    """Stop the lab of ``work``: the owner first (it stops its children and writes its
    audit), then any recorded child left behind by an owner that was killed; a pid whose
    start time or command line no longer matches its record is someone else's."""
    from relakit.lab.lab import stop_lab

    _require_running(work)
    result = stop_lab(work)
    for r in result["stopped"]:
        print(f"stopped {r.get('name', 'lab up')} (pid {r['pid']})")
    for r in result["left_alone"]:
        print(f"left pid {r['pid']} alone: it is no longer the lab's "
              f"{r.get('name', 'lab up')} (another start time or command line)")
    if result["remaining"]:  # cannot happen short of a process ignoring SIGKILL
        print(f"still running: {', '.join(str(r['pid']) for r in result['remaining'])}; "
              f"kept {work / 'state.json'}")
        return 1
    if not result["stopped"]:
        print("no process of the lab was running")
    print(f"lab down: none of its {result['recorded']} recorded processes is running; "
          f"removed {work / 'state.json'}")
    return 0


def load(work: Path, phases: list[tuple[float, float]], seed: int | None = None) -> int:
    """Send open-loop load to the running lab, phase by phase (seconds, requests/s);
    print the outcomes by tier and keep every request in ``requests.parquet``. ``seed``:
    the load's draws (None: a fresh one, printed, so the load can be repeated)."""
    import secrets

    import polars as pl

    from relakit.io import write_parquet
    from relakit.lab.lab import Lab
    from relakit.lab.load import run_load
    from relakit.progress import Progress, Ticker

    _require_running(work)
    lab = Lab.attach(work)
    if seed is None:
        seed = secrets.randbits(31)
        print(f"lab load: seed {seed} (--seed {seed} repeats this load)")
    with Ticker(Progress("lab load", sum(seconds for seconds, _ in phases), "s of load"),
                wall=True):
        recs = run_load(lab, phases, seed=seed)
    table = pl.DataFrame(recs)
    print(outcome_counts(table))
    print(f"wrote {write_parquet(table, work / 'requests.parquet')}")
    return 0


def record(work: Path, out: Path, since_s: float | None = None) -> int:
    """Save what the running lab's Prometheus scraped over the last ``since_s`` seconds
    (None: since the lab started), in the trace importer's format (for ``relakit
    replay``)."""
    from relakit.lab.lab import Lab

    _require_running(work)
    lab = Lab.attach(work)
    start = lab.started_at if since_s is None else time.time() - since_s
    print(f"wrote {lab.record(out, start)}")
    return 0


def outcome_counts(table) -> str:
    """User requests by tier (rows) and outcome (columns), as a plain text table."""
    from relakit.vocab import IN_PATH_OUTCOMES, OUTCOMES
    from relakit.vocab import TIERS as tiers

    counts = {(r["tier"], r["outcome"]): r["len"]
              for r in table.group_by("tier", "outcome").len().iter_rows(named=True)}
    seen = {o for _, o in counts}  # the in-path outcomes (issue 33) only when there are any
    outcomes = [o for o in OUTCOMES if o not in IN_PATH_OUTCOMES or o in seen]
    rows = [["tier", *outcomes, "requests"]]
    for tier in tiers:
        n = [counts.get((tier, o), 0) for o in outcomes]
        rows.append([tier, *map(str, n), str(sum(n))])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths, strict=True)))
                      for r in rows)


def _require_running(work: Path) -> None:
    if not (work / "state.json").is_file():
        raise ScenarioError(f"{work}: no running lab here (no state.json); "
                            f"start one with `relakit lab up --dir {work}`")
