"""`linvit decide`: run a grid with a sequential plan look by look, adding seeds only where a claim's test
is still undecided.

    linvit decide [SNAKEMAKE ARGS]        e.g. --cores 2, or --profile slurm; --configfile as Snakemake's

Look 1 is the grid as configured. After each look the report rule has judged every deciding test at
its looks (linvit.stats.sequential, through linvit.claims.judge); the driver records each test's
decision (decided at look k, continuing, or stopped for futility) in results/decide/state.json, and the
next look's seeds go only to the roles a continuing test of an undecided claim needs (the softmax
reference too where that test reads it; with a teacher per seed, those seeds' teachers follow from the
grid). Decided tests, the positive control and every other role keep the seeds they had; runs still
pair by seed. The look's runs are Snakemake's `added_seeds` config (results/decide/look.yaml, written
here, passed as a last --configfile), so Snakemake plans, runs and resumes them like any job.

It resumes: killed at any point and rerun, it continues at the recorded look (Snakemake reruns nothing
finished), and it checks that every recorded look reads the same from the results now, so a past look is
never re-decided with data that came after it. A second driver on the same results folder is refused
(an flock on results/decide/driver.lock, held by the driver and the Snakemake it runs), and so is a plan
that changed after the first look (its fingerprint is recorded).

Where it runs on a cluster: where Snakemake would, on the login node (or in a small head job that may run
for days, e.g. `sbatch --wrap "linvit decide --profile slurm"`); it only waits for Snakemake, which
submits the training jobs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import tempfile
import time
from pathlib import Path

import yaml

from .config import NO_DESIGN, REFERENCE_INIT, seed_sequence
from .decide_inputs import (CELL_KEYS, DEFAULT_CONFIGS, changes, deciding, grid_config, grown_axes, is_dry_run,
                            keep_going, linear_cells, merged_config, split_args)
from .decide_process import record_snakemake, run_snakemake
from .decide_state import (LOCK, LOOK, STATE, DecideError, check_state, lock_holder, read_runs, stamp,
                           with_seeds, write_state)
from .grid import REFERENCE_VARIANT, REPORT, RESULTS, all_cells, decide_dir, log_path
from .io import write_text
from .status_decide import broken_runs

# A look's statistic must read the same when the driver reads it again (floating point of the same runs).
SAME = 1e-9


class Driver:
    """One sequential run over a results folder: its state, its lock, and the looks."""

    def __init__(self, config: dict, files: list[str], results: str | Path = RESULTS, report: str | Path = REPORT):
        from .claims.table import Design

        self.config, self.files = config, files
        self.design = Design.from_config(config)
        if self.design is None:
            raise DecideError(f"{' + '.join(files)}: no `sequential:` plan (looks, spending); linvit decide runs "
                              f"a sequential grid (workflow/config/decide.yaml is the default grid's plan)")
        self.plan = self.design.plan
        self.folder = Path(decide_dir(results))
        self.report = Path(report)
        self.state_path, self.look_path = self.folder / STATE, self.folder / LOOK

    # --- state ---------------------------------------------------------------------------------------------
    def load_state(self) -> dict:
        fresh = {"plan": self.plan.as_dict(), "fingerprint": self.plan.fingerprint(), "looks": [],
                 "next": {"look": 1, "added": []}}
        if not self.state_path.exists():
            return fresh
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise DecideError(f"{self.state_path}: unreadable ({err}); it records the looks so far: restore it, "
                              f"or move it away to start the sequence again") from None
        check_state(state, self.state_path)  # its shape, before anything reads it
        if isinstance(state, dict) and not state.get("looks"):
            return fresh  # no look is recorded (look 1 failed or was stopped): the plan and config may still change
        if state.get("fingerprint") != self.plan.fingerprint():
            plan = lambda p: {f"sequential.{k}": json.dumps(v) for k, v in (p or {}).items()}  # noqa: E731
            said = changes(plan(state.get("plan")), plan(self.plan.as_dict())) or ["its fingerprint"]
            raise DecideError(f"{self.state_path}: the plan changed after look 1 "
                              f"({'; '.join(said)}); a sequential plan is fixed before the first look. "
                              + self.new_sequence)
        return check_state(state, self.state_path, self.plan.looks, self.config)  # its looks and seeds: the plan's

    @property
    def new_sequence(self) -> str:
        return (f"Change it back, or start a new sequence: move {self.folder} away (its looks are then forgotten; runs "
                f"whose settings changed retrain), or run in another --directory")

    def check_config(self, state: dict) -> list[tuple[str, str, str, int]]:
        """Everything that decides (`deciding`) reads as at the last recorded look; else one line naming the key.
        Called before Snakemake runs, so a changed setting never retrains a decided look's runs. The one change
        taken: cells added to the grid's axes (`ADDABLE`, each axis a superset of what it was) while a look is to
        come; they are returned (dataset, size, variant, budget) for `seed_cells`."""
        if not state["looks"] or "decides" not in state:  # nothing decided yet, or a state from before it was kept
            return []
        now = deciding(self.config)
        said = changes(state["decides"], now)
        if not said:
            return []
        grown = grown_axes(state["decides"], now)
        last = state["looks"][-1]["look"]
        if grown is not None and state["next"] is not None:
            return linear_cells(self.config) - linear_cells({**self.config, **grown})
        more = f" (and {len(said) - 1} more: {'; '.join(said[1:3])}{' ...' if len(said) > 3 else ''})" \
            if len(said) > 1 else ""
        if grown is not None:  # cells added after the last look: no look is left to read them
            raise DecideError(f"{self.state_path}: cells were added after the sequence ended at look {last}: "
                              f"{said[0]}{more}; no look is left to read them. " + self.new_sequence)
        key = said[0].split(":")[0]
        cell = (" A cell is added by extending targets, sizes, variants or budgets (their past values kept); "
                "another axis or a removal would change what the decided looks read." if key in CELL_KEYS else "")
        raise DecideError(f"{self.state_path}: the config changed after look {last}: "
                          f"{said[0]}{more}; a sequence's looks are read under one config.{cell} "
                          + self.new_sequence)

    def seed_cells(self, state: dict, cells, say=print) -> None:
        """Give `cells` (added mid-sequence) every seed up to the next look: each role a deciding test of theirs
        reads gets the seeds the grid's own `seeds` lack (the base seeds train as for any cell), so the report
        reads their tests at every look, on that look's seeds, as if they had been there from look 1. Recorded
        in the next look (`cells_added`) and `decides`; in `state` only (run() saves it, a dry run does not)."""
        look = state["next"]["look"]
        seeds = seed_sequence(self.config, self.plan.looks[look - 1])
        roles = deciding_roles(self.config)
        runs = [(dataset, size, v, init, design, budget)
                for dataset, size, variant, budget in sorted(cells) for v, init, design in roles(variant)]
        state["next"]["added"] = with_seeds(state["next"]["added"], runs, seeds[len(self.config["seeds"]):])
        keys = [f"{d}/{s}/{v}/steps{b}" for d, s, v, b in sorted(cells)]
        state["next"]["cells_added"] = list(dict.fromkeys([*state["next"].get("cells_added", []), *keys]))
        state["decides"] = deciding(self.config)
        say(f"decide: {len(keys)} cell{'s' if len(keys) != 1 else ''} added before look {look} "
            f"({', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}): the roles of their tests get seeds "
            f"{seeds[0]}-{seeds[-1]}, and the report reads them at every look on that look's seeds")

    def save_state(self, state: dict) -> None:
        write_state(self.state_path, state)

    def write_look(self, state: dict, path: Path | None = None) -> None:
        """The look's runs as Snakemake config (`added_seeds`), with the look it is (`decide_look`: the report
        reads it with the runs it has) and the runs each recorded look was read without (`dropped_runs`: they
        stay out of that look when the report reads it again), beside the state (or at `path`)."""
        self.folder.mkdir(parents=True, exist_ok=True) if path is None else None
        dropped = [{"look": r["look"], "runs": r["failed"]} for r in state["looks"] if r.get("failed")]
        look = {"added_seeds": state["next"]["added"], "decide_look": state["next"]["look"],
                **({"dropped_runs": dropped} if dropped else {})}
        text = ("# Written by linvit decide: the runs the looks after the first added (the roles an undecided test\n"
                "# needs), the look it runs and the runs earlier looks were read without. Passed to Snakemake as\n"
                "# the last --configfile; not for editing.\n"
                + yaml.safe_dump(look, sort_keys=False))
        write_text(path or self.look_path, text)

    def preview(self, snakemake_args: list[str], say=print) -> None:
        """A dry run (`linvit decide -n`): Snakemake's dry run of the current look, and what the driver would do
        after it. Nothing is recorded (no state, no look.yaml, no lock: a running driver's folder is only read)."""
        state = self.load_state()
        added_cells = self.check_config(state)
        if added_cells:
            self.seed_cells(state, added_cells, say)
        if state["next"] is None:
            say(f"decide: dry run: the sequence is done after look {state['looks'][-1]['look']} (nothing to run; "
                f"nothing recorded)")
            return
        look, added = state["next"]["look"], state["next"]["added"]
        last = len(self.plan.looks)
        say(f"decide: dry run of look {look} of {last} ({self.plan.looks[look - 1]} seeds"
            + (f"; {sum(len(a['seeds']) for a in added)} added runs so far" if added else "; the grid as configured")
            + f"): Snakemake's dry run follows; nothing is recorded in {self.state_path}")
        with tempfile.TemporaryDirectory(prefix="linvit-decide-") as tmp:
            path = Path(tmp) / LOOK
            self.write_look(state, path)
            code = run_snakemake(["snakemake", *snakemake_args, "--configfile", *self.files, str(path)])
        if code:
            raise DecideError(f"look {look}: snakemake's dry run exited {code}")
        if look < last:
            seeds = seed_sequence(self.config, self.plan.looks[look])[self.plan.looks[look - 1]:]
            after = (f"then the report judges look {look}, and look {look + 1} adds seeds {seeds[0]}-{seeds[-1]} to "
                     f"the roles of the tests still undecided")
        else:
            after = f"then the report judges look {look}, the plan's last: the sequence ends"
        say(f"decide: dry run: {after} (run without -n to run it)")

    # --- one look ------------------------------------------------------------------------------------------
    def decisions(self) -> dict[str, dict]:
        """Every deciding test of a linear cell, as the report judged it: id -> outcome, the look it stopped at,
        its looks, the roles it reads and its claim's outcome in the cell (report/claims.json)."""
        from dataclasses import asdict

        from .claims.verdicts import read_verdicts

        path = self.report / "claims.json"
        try:
            verdicts = read_verdicts(path)
        except (OSError, ValueError) as err:  # ValueError: not JSON (json.JSONDecodeError), or not verdicts
            raise DecideError(f"{path}: cannot read the look's verdicts ({err})") from None
        roles = deciding_roles(self.config)
        out = {}
        for verdict in verdicts:
            for cell in verdict.cells:  # the linear variants' cells: the control decides nothing
                for t in cell.tests:
                    if not t.decides or t.name not in roles.tests:
                        continue
                    out[f"{verdict.claim} {cell.key} {t.name}"] = {
                        "claim": verdict.claim, "claim_outcome": cell.outcome, "outcome": t.outcome,
                        "stopped": t.stopped, "looks": t.looks, "cell": asdict(cell),
                        "roles": roles(cell.variant, t.name)}
        return out

    def next_added(self, decisions: dict[str, dict], look: int, added: list[dict]) -> tuple[list[dict], list[str]]:
        """The runs look `look` + 1 adds to `added`: the next seeds of every role a continuing test of a
        continuing claim reads. Also the ids of the tests that wait for them."""
        from .claims.verdicts import STILL_OPEN
        from .stats.sequential import CONTINUES

        new_seeds = seed_sequence(self.config, self.plan.looks[look])[self.plan.looks[look - 1]:]
        waiting = [test_id for test_id, d in decisions.items()
                   if d["outcome"] == CONTINUES and d["claim_outcome"] in STILL_OPEN]
        roles = [(cell["dataset"], cell["size"], variant, init, design, int(cell["budget"]))
                 for t in waiting for cell in [decisions[t]["cell"]] for variant, init, design in decisions[t]["roles"]]
        return with_seeds(added, roles, new_seeds), waiting

    def check_past(self, state: dict, decisions: dict[str, dict]) -> None:
        """Every recorded look reads the same now: its runs were not replaced since it was decided."""
        for record in state["looks"]:
            k = record["look"]
            for test_id, past in record["tests"].items():
                now = decisions.get(test_id)
                look = now and next((x for x in now["looks"] if x["look"] == k), None)
                if look is None:
                    raise DecideError(f"{self.state_path}: look {k} of {test_id} is recorded, but the results no "
                                      f"longer give it; were runs of its seeds removed?")
                if look["outcome"] != past["outcome"] or not same(look["statistic"], past["statistic"]):
                    raise DecideError(f"{self.state_path}: look {k} of {test_id} was decided {past['outcome']} "
                                      f"(T {past['statistic']:.6g}) and now reads {look['outcome']} "
                                      f"(T {look['statistic']:.6g}): runs of its seeds changed after it was decided")

    def failed_runs(self, look: int, added: list[dict], code: int, before, say=print) -> list[str]:
        """After a look's Snakemake exited `code` (under --keep-going): the keys of the look's runs that did not
        finish, where the report was still made for this look (report/claims.json changed since `before`: the
        workflow's onerror makes it from the runs that finished; it drops the others from their cells for this
        look and names them). Else one line naming the failed jobs' logs."""
        from .grid import jobs

        config = {**self.config, "added_seeds": added}
        results = self.folder.parent
        if stamp(self.report / "claims.json") in (before, None):
            logs = [job.log for job in jobs(config, results, self.report)
                    if job.rule != "report" and not all(Path(out).exists() for out in job.outputs)
                    and Path(job.log).exists()]
            logs += [p for p in (log_path("report", "all", results), log_path("report", "partial", results))
                     if Path(p).exists()]
            raise DecideError(f"look {look}: snakemake exited {code} and made no report for this look; "
                              + (f"the failed jobs' logs: {', '.join(logs[:4])}"
                                 + (f" and {len(logs) - 4} more" if len(logs) > 4 else "")
                                 if logs else "no job's log names the failure (see Snakemake's output above)")
                              + f"; fix what they report and rerun linvit decide (it resumes at look {look})")
        failed = [key for key, _, _ in broken_runs(all_cells(config), results)]
        say(f"decide: look {look}: snakemake exited {code}; " + (
            f"the report read the look without the {len(failed)} run{'s' if len(failed) != 1 else ''} that did not "
            f"finish ({', '.join(failed[:3])}{' ...' if len(failed) > 3 else ''}); the next look tries them again"
            if failed else "every run of the look finished and the report was made: the look is read from it"))
        return failed

    def check_done(self, state: dict, snakemake_args: list[str], say=print) -> None:
        """After the last look: every run a recorded look read is still there and whole (a lost or truncated file
        would otherwise leave the sequence "done" over a report that no longer reads its looks), and the report
        still gives every recorded look. Else one line per run and the command that makes them again."""
        results = self.folder.parent
        broken = broken_runs(read_runs(self.config, state), results)
        command = shlex.join(state.get("command") or ["snakemake", *snakemake_args, "--configfile", *self.files,
                                                      str(self.look_path)])
        if broken:
            for key, wrong, _ in broken:
                say(f"decide: run {key}: {wrong}")
            files = [f for _, _, remove in broken for f in remove]
            raise DecideError(f"{len(broken)} run{'s' if len(broken) > 1 else ''} the recorded looks read "
                              f"{'are' if len(broken) > 1 else 'is'} missing or broken (listed above): "
                              + (f"remove the broken files (rm {' '.join(files)}), then " if files else "")
                              + f"make them and the report again with the last look's runs: `{command}`; then rerun "
                              f"linvit decide, which checks that every look reads as it was decided")
        try:
            decisions = self.decisions()
        except DecideError as err:
            raise DecideError(f"{err}; make the report again with the last look's runs: `{command}`") from None
        try:
            self.check_past(state, decisions)
        except DecideError as err:
            raise DecideError(f"{err}. If the report was made without the looks' runs (a plain snakemake), make it "
                              f"again with them: `{command}`") from None

    # --- the loop ------------------------------------------------------------------------------------------
    def run(self, snakemake_args: list[str], say=print) -> dict:
        """The looks from the recorded one on, each: Snakemake, the report's decisions, the record, the next look's
        runs; then the check that every look still reads as decided."""
        lock = self.take_lock()
        state = self.load_state()
        added_cells = self.check_config(state)  # before Snakemake: a changed setting would retrain decided runs
        if added_cells:
            self.seed_cells(state, added_cells, say)
        self.save_state(state)
        snakemake_args = keep_going(snakemake_args)
        while state["next"] is not None:
            self.run_look(state, snakemake_args, lock, say)
        self.check_done(state, snakemake_args, say)
        say(f"decide: done after look {state['looks'][-1]['look']}; report in {self.report}/README.md")
        return state

    def take_lock(self):
        """driver.lock, flock'ed for the driver's life and named by its line; else one line naming its live holder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        lock = open(self.folder / LOCK, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock_holder(lock.read().strip())  # the live one: a killed driver's Snakemake may hold it
            raise DecideError(f"{self.folder / LOCK}: another linvit decide runs on this results folder "
                              f"({holder}); wait for it or stop it") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        lock.flush()
        return lock

    def run_look(self, state: dict, snakemake_args: list[str], lock, say=print) -> None:
        """One look: its Snakemake, the report's decisions read and checked against the past looks, the look
        recorded with the next look's runs (none after the cap, or once no test waits)."""
        look, added = state["next"]["look"], state["next"]["added"]
        n = self.plan.looks[look - 1]
        say(f"decide: look {look} of {len(self.plan.looks)} ({n} seeds"
            + (f"; {sum(len(a['seeds']) for a in added)} added runs so far" if added else "; the grid as configured")
            + ")")
        self.write_look(state)
        before = stamp(self.report / "claims.json")  # a report/claims.json that differs after was made by this look
        cmd = ["snakemake", *snakemake_args, "--configfile", *self.files, str(self.look_path)]
        # Snakemake holds the lock too while it runs (and driver.lock names it); a signal stops it cleanly
        code = run_snakemake(cmd, lock, lambda pid: record_snakemake(lock, pid))
        failed = self.failed_runs(look, added, code, before, say) if code else []
        decisions = self.decisions()
        self.check_past(state, decisions)
        state["looks"].append(self.record(state, decisions, failed))
        state["decides"] = deciding(self.config)  # what the next look must be read under (check_config)
        state["command"] = cmd
        if look == len(self.plan.looks):
            state["next"] = None
        else:
            more, waiting = self.next_added(decisions, look, added)
            state["next"] = {"look": look + 1, "added": more, "waiting": waiting} if waiting else None
        self.save_state(state)
        for test_id, d in decisions.items():
            say(f"decide: look {look}: {test_id}: {d['outcome']}" + (f" at look {d['stopped']}" if d["stopped"] else ""))

    def record(self, state: dict, decisions: dict[str, dict], failed: list[str]) -> dict:
        """The look just run, as state.json records it: its seeds, added and failed runs, cells added before it
        and every deciding test's outcome, statistic and repeated interval at it."""
        look = state["next"]["look"]
        record = {"look": look, "seeds": self.plan.looks[look - 1], "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "added": state["next"]["added"], "failed": failed, "tests": {}}
        if state["next"].get("cells_added"):
            record["cells_added"] = state["next"]["cells_added"]
        for test_id, d in decisions.items():
            at = next((x for x in d["looks"] if x["look"] == look), None)
            if at is not None:
                record["tests"][test_id] = {key: at[key] for key in ("outcome", "statistic", "estimate", "low", "high")}
        return record


def same(a: float, b: float) -> bool:
    """Two readings of one statistic: within SAME, or the same infinity, or both NaN."""
    return a == b or abs(a - b) <= SAME or (a != a and b != b)


class deciding_roles:
    """The runs each deciding test of a linear cell reads, as (variant, init, design) in its cell: its roles'
    strategies (resolved from the config's init strategies) and the softmax reference where it reads it.
    Called with a variant and a test's name (one test), or a variant alone (every deciding test, each run once)."""

    def __init__(self, config: dict):
        from .claims.roles import resolve_roles
        from .claims.table import CLAIMS, REFERENCE

        self.reference = REFERENCE
        self.tests = {t.statistic.name: t.statistic.roles for c in CLAIMS for t in c.deciding}
        self.matches = resolve_roles(config)

    def __call__(self, variant: str, test: str | None = None) -> list[tuple[str, str, str]]:
        runs = []
        for role in (self.tests[test] if test else [r for rs in self.tests.values() for r in rs]):
            if role == self.reference:
                runs.append((REFERENCE_VARIANT, REFERENCE_INIT, NO_DESIGN))
            elif self.matches[role].key is not None:
                runs.append((variant, *self.matches[role].key))
        return list(dict.fromkeys(runs))


def main(argv: list[str]) -> None:
    files, rest, directory = split_args(argv)
    config, rest = grid_config(rest)
    files = [*config, *files] or list(DEFAULT_CONFIGS)
    # A killed look leaves jobs Snakemake marks incomplete: rerunning them is how the driver resumes (the
    # training jobs continue from their checkpoints).
    if "--rerun-incomplete" not in rest and "--ri" not in rest:
        rest.append("--rerun-incomplete")
    driver = Driver(merged_config(files), files, Path(directory) / RESULTS, Path(directory) / REPORT)
    if is_dry_run(rest):  # what the look would run; nothing recorded
        return driver.preview(rest)
    driver.run(rest)
