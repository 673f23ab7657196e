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
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from .config import ConfigError, NO_DESIGN, REFERENCE_INIT, load_config, seed_sequence, validate
from .grid import REFERENCE_VARIANT, REPORT, RESULTS, all_cells, decide_dir, log_path
from .io import write_text
from .runrecord import merge_config

DEFAULT_CONFIGS = ("workflow/config/default.yaml", "workflow/config/decide.yaml")
STATE, LOOK, LOCK = "state.json", "look.yaml", "driver.lock"  # in grid.decide_dir
# A look's statistic must read the same when the driver reads it again (floating point of the same runs).
SAME = 1e-9


class DecideError(ValueError):
    """A refusal or a broken run, in one line (linvit's CLI prints it without a traceback)."""


def split_args(argv: list[str]) -> tuple[list[str], list[str], str]:
    """(config files named by --configfile/--configfiles, every other argument for Snakemake, the folder
    Snakemake runs in: its --directory, else here)."""
    files, rest, i = [], [], 0
    directory = "."
    while i < len(argv):
        arg = argv[i]
        if arg in ("--directory", "-d"):
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                raise DecideError(f"{arg} names no folder (the project folder Snakemake runs in)")
            directory = argv[i + 1]
        elif arg.startswith("--directory="):
            directory = arg.split("=", 1)[1]
        if arg in ("--configfile", "--configfiles"):
            i, given = i + 1, len(files)
            while i < len(argv) and not argv[i].startswith("-"):
                files.append(argv[i])
                i += 1
            if len(files) == given:  # never the default grid in their place
                raise DecideError(f"{arg} names no file (the grid's config files, e.g. --configfile grid.yaml)")
            continue
        if arg.startswith(("--configfile=", "--configfiles=")):
            if not arg.split("=", 1)[1]:
                raise DecideError(f"{arg} names no file (the grid's config files, e.g. --configfile=grid.yaml)")
            files.append(arg.split("=", 1)[1])
        elif arg in ("--config", "-C") or arg.startswith("--config="):
            raise DecideError("--config overrides are not mirrored by the driver (it must read the plan Snakemake "
                              "runs): put them in a config file and give it with --configfile")
        else:
            rest.append(arg)
        i += 1
    return files, rest, directory


def merged_config(files: list[str]) -> dict:
    """The config Snakemake builds from `files`: each laid over the previous one, mappings key by key."""
    config: dict = {}
    for f in files:
        if not Path(f).is_file():
            raise DecideError(f"--configfile {f}: no such file")
        merge_config(config, load_config(f))
    try:
        return validate(config)
    except ConfigError as err:
        raise DecideError(f"{' + '.join(files)}: {err}") from None


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
        self.folder.mkdir(parents=True, exist_ok=True)
        write_text(self.state_path, json.dumps(state, indent=2, sort_keys=True) + "\n")

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
        state = self.load_state()
        added_cells = self.check_config(state)  # before Snakemake: a changed setting would retrain decided runs
        if added_cells:
            self.seed_cells(state, added_cells, say)
        self.save_state(state)
        snakemake_args = keep_going(snakemake_args)
        while True:
            if state["next"] is None:
                self.check_done(state, snakemake_args, say)
                say(f"decide: done after look {state['looks'][-1]['look']}; report in {self.report}/README.md")
                return state
            look, added = state["next"]["look"], state["next"]["added"]
            n = self.plan.looks[look - 1]
            jobs = sum(len(a["seeds"]) for a in added)
            say(f"decide: look {look} of {len(self.plan.looks)} ({n} seeds"
                + (f"; {jobs} added runs so far" if added else "; the grid as configured") + ")")
            self.write_look(state)
            before = stamp(self.report / "claims.json")  # a report/claims.json that differs after was made by this look
            cmd = ["snakemake", *snakemake_args, "--configfile", *self.files, str(self.look_path)]
            # Snakemake holds the lock too while it runs (and driver.lock names it); a signal stops it cleanly
            code = run_snakemake(cmd, lock, lambda pid: record_snakemake(lock, pid))
            failed = self.failed_runs(look, added, code, before, say) if code else []
            decisions = self.decisions()
            self.check_past(state, decisions)
            record = {"look": look, "seeds": n, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "added": added,
                      "failed": failed, "tests": {}}
            if state["next"].get("cells_added"):
                record["cells_added"] = state["next"]["cells_added"]
            for test_id, d in decisions.items():
                at = next((x for x in d["looks"] if x["look"] == look), None)
                if at is not None:
                    record["tests"][test_id] = {"outcome": at["outcome"], "statistic": at["statistic"],
                                                "estimate": at["estimate"], "low": at["low"], "high": at["high"]}
            state["looks"].append(record)
            state["decides"] = deciding(self.config)  # what the next look must be read under (check_config)
            state["command"] = ["snakemake", *snakemake_args, "--configfile", *self.files, str(self.look_path)]
            if look == len(self.plan.looks):
                state["next"] = None
            else:
                more, waiting = self.next_added(decisions, look, added)
                state["next"] = {"look": look + 1, "added": more, "waiting": waiting} if waiting else None
            self.save_state(state)
            for test_id, d in decisions.items():
                say(f"decide: look {look}: {test_id}: {d['outcome']}"
                    + (f" at look {d['stopped']}" if d["stopped"] else ""))


def same(a: float, b: float) -> bool:
    """Two readings of one statistic: within SAME, or the same infinity, or both NaN."""
    return a == b or abs(a - b) <= SAME or (a != a and b != b)


# --- what decides a sequence (recorded at each look; a change between looks is refused, naming the key) ----
# Config keys that decide nothing a look reads or trains: the grid's description, its resources (threads,
# memory, time: how jobs are scheduled, not what they compute) and the driver's own added_seeds. Every other
# key decides, a key the schema gains later included, until it is named here.
NOT_DECIDING = ("description", "resources", "added_seeds")
# The cells' axes and roles: a change other than a cell added (ADDABLE) would change what decided looks read.
CELL_KEYS = ("targets", "sizes", "variants", "budgets", "inits", "control_inits", "distills")
LONG = 120  # a value whose JSON is longer is recorded as its digest (the key is still named)


def deciding(config: dict) -> dict[str, str]:
    """Everything that decides a sequence, key by key: dotted key -> the value as canonical JSON (or
    'sha256:<16 hex>' where that is longer than LONG). The plan and `claims.*` with their defaults filled in
    (a default written out is no change), the seeds, the cells' axes, and what the runs train and how they
    are judged: teacher(s), student, distill, evaluation, runtime, shards, the datasets, init strategies and
    distillation designs the grid uses (an unused one may change), and any other key but NOT_DECIDING."""
    from dataclasses import asdict

    from .config import designs
    from .claims.table import Design, Thresholds
    from .stats.paired import Settings

    given = {k: v for k, v in config.items() if k not in NOT_DECIDING}
    given["sequential"] = Design.from_config(config).plan.as_dict()
    given["claims"] = {**asdict(Thresholds()), **asdict(Settings()), **(config.get("claims") or {})}
    inits = list(dict.fromkeys([*config["inits"], *(config.get("control_inits") or [])]))
    if "init_strategies" in given:
        given["init_strategies"] = {k: v for k, v in config["init_strategies"].items() if k in inits}
    if "distill_designs" in given:
        used = {d for i in inits for d in designs(config, i)}
        given["distill_designs"] = {k: v for k, v in config["distill_designs"].items() if k in used}
    if "datasets" in given:
        used = {*config["targets"], (config.get("teacher") or {}).get("dataset")}
        given["datasets"] = {k: v for k, v in config["datasets"].items() if k in used}
    out: dict[str, str] = {}

    def walk(node, key: str) -> None:
        if isinstance(node, dict) and node:
            for k in sorted(node):
                walk(node[k], f"{key}.{k}" if key else str(k))
            return
        text = json.dumps(node, sort_keys=True)
        out[key] = text if len(text) <= LONG else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    walk(given, "")
    return out


def changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """Each key whose value differs, as 'key: before -> now' ('(not set)' for a key one side lacks); the shallowest
    first (an init dropped from `inits` is named before its strategy's settings, which go with it)."""
    return [f"{k}: {before.get(k, '(not set)')} -> {now.get(k, '(not set)')}"
            for k in sorted({*before, *now}, key=lambda k: (k.count("."), k)) if before.get(k) != now.get(k)]


# The axes a cell is added by mid-sequence (Driver.seed_cells): each a list that keeps its past values.
ADDABLE = ("targets", "sizes", "variants", "budgets")


def grown_axes(before: dict[str, str], now: dict[str, str]) -> dict[str, list] | None:
    """Where every change between two `deciding` records is cells added (an ADDABLE axis grown, its past values
    kept, and the definitions of datasets it newly uses): each grown axis's values before. Else None."""
    grown = {}
    for key in {*before, *now}:
        if before.get(key) == now.get(key):
            continue
        if key.startswith("datasets.") and key not in before:
            continue  # a new target's definition (the record holds the datasets the grid uses)
        try:
            old, new = json.loads(before[key]), json.loads(now[key])
        except (KeyError, ValueError):  # a key one side lacks, or a digest
            return None
        if key not in ADDABLE or not isinstance(old, list) or not isinstance(new, list) or not set(old) <= set(new):
            return None
        grown[key] = old
    return grown


def linear_cells(config: dict) -> set[tuple[str, str, str, int]]:
    """The grid's linear cells (dataset, size, variant, budget): those whose tests decide."""
    return {(c.dataset, c.size, c.variant, c.budget) for c in all_cells(config)
            if not c.is_reference and not c.is_control}


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


# --- the runs the looks read (after the last look, each must still be there and whole) ----------------------
def keep_going(args: list[str]) -> list[str]:
    """Snakemake's arguments with --keep-going: a run that fails leaves the others of its look to finish, and the
    workflow's onerror still makes the report, which reads the look without it (Driver.failed_runs)."""
    return args if {"--keep-going", "-k"} & set(args) else [*args, "--keep-going"]


def stamp(path: Path) -> tuple | None:
    """What tells a file written again (an atomic write is a new inode): None where it does not exist."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_runs(config: dict, state: dict) -> list:
    """The runs (grid.Cell) the recorded looks read: each look's grid with the seeds it had added, less the runs
    that failed at it; in grid order, each once."""
    from .grid import all_cells

    runs = {}
    for record in state.get("looks") or []:
        failed = set(record.get("failed") or [])
        for cell in all_cells({**config, "added_seeds": record.get("added") or []}):
            if cell.key not in failed:
                runs.setdefault(cell.key, cell)
    return list(runs.values())


def broken_runs(cells, results: str | Path = RESULTS) -> list[tuple[str, str, list[str]]]:
    """Each of `cells`' runs (grid.Cell) whose files the report reads are missing or not whole: (its key, what is
    wrong, the files to remove: those there but broken, which Snakemake, judging by times, would never remake)."""
    from .status import WHOLE, unreadable

    out = []
    for cell in cells:
        folder = cell.run_dir(results)
        wrong = [(name, why) for name in WHOLE if (why := unreadable(folder / name))]
        if not wrong:
            continue
        if all(why == "missing" for _, why in wrong) and len(wrong) == len(WHOLE):
            said = f"missing ({folder})"
        else:
            said = "; ".join(f"{folder / name} {why}" for name, why in wrong)
        out.append((cell.key, said, [str(folder / name) for name, why in wrong if why != "missing"]))
    return out


def grid_config(rest: list[str]) -> tuple[list[str], list[str]]:
    """`linvit decide CONFIG [ARGS]`: an argument naming a .yaml/.yml file outside --configfile is the grid's
    config, run under its own `sequential:` plan or, where it has none, the shipped plan (DEFAULT_CONFIGS'
    decide.yaml) laid over it. (Its config files, the other arguments.) Snakemake's targets here are rules and
    results files, never a YAML file."""
    named = [a for a in rest if a.endswith((".yaml", ".yml")) and not a.startswith("-")]
    if not named:
        return [], rest
    if len(named) > 1:
        raise DecideError(f"{' and '.join(named)}: one grid config at a time (give more with --configfile)")
    path = Path(named[0])
    if not path.is_file():
        raise DecideError(f"{path}: no such config file")
    try:
        plan = [] if "sequential" in load_config(path) else [DEFAULT_CONFIGS[1]]
    except ConfigError as err:
        raise DecideError(f"{path}: {err}") from None
    return [str(path), *plan], [a for a in rest if a != named[0]]


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




RUN_KEYS = ("dataset", "size", "variant", "init", "design", "budget")  # an added_seeds entry: its run, then seeds


def with_seeds(added: list[dict], roles, seeds: list[int]) -> list[dict]:
    """`added` (added_seeds entries) with `seeds` added to each of `roles` (tuples in RUN_KEYS order); a role
    not there yet is appended. Earlier entries keep their order and seeds."""
    runs = {tuple(a[k] for k in RUN_KEYS): list(a["seeds"]) for a in added}
    for role in roles:
        runs[tuple(role)] = sorted(set(runs.get(tuple(role), [])) | set(seeds))
    return [{**dict(zip(RUN_KEYS, role)), "seeds": s} for role, s in runs.items()]


def current_config(config: dict, root: str | Path = ".", results: str | Path = RESULTS) -> dict:
    """`config` with the runs the sequential driver has added so far in `root` (its current look's), so that
    `linvit status` lists the jobs Snakemake runs now. `config` itself where no driver ran."""
    state = read_state(root, results)
    if state is None:
        return config
    return {**config, "added_seeds": _added_now(state)}


def read_state(root: str | Path = ".", results: str | Path = RESULTS) -> dict | None:
    """The driver's record of a sequential run in `root` (None where no driver ran); DecideError if unreadable
    or not the driver's record (check_state, against its own plan)."""
    path = Path(root) / decide_dir(results) / STATE
    if not path.exists():
        return None
    try:
        return check_state(json.loads(path.read_text()), path)
    except (OSError, json.JSONDecodeError) as err:
        raise DecideError(f"{path}: unreadable ({err})") from None


def _added_now(state: dict) -> list[dict]:
    if state.get("next"):
        return state["next"]["added"]
    return state["looks"][-1]["added"] if state["looks"] else []


def status_lines(config: dict, root: str | Path = ".", results: str | Path = RESULTS) -> list[str]:
    """What `linvit status` says of a sequential run: the look, the tests still waiting and the seeds they
    wait for, the jobs the current look adds, and the jobs the next would add if they stay undecided."""
    from .grid import jobs

    state = read_state(root, results)
    if state is None:
        return []
    plan = state["plan"]
    looks = plan["looks"]
    base = {k: v for k, v in config.items() if k != "added_seeds"}
    lines = [f"Sequential plan: looks at {', '.join(map(str, looks))} seeds, {plan['spending']} spending, "
             f"futility below {plan['futility']} conditional power from look {plan['futility_from']}"
             if plan.get("futility") is not None else
             f"Sequential plan: looks at {', '.join(map(str, looks))} seeds, {plan['spending']} spending, no futility"]
    done = state["looks"]
    if state.get("next") is None:
        last = done[-1]
        broken = broken_runs(read_runs(base, state), Path(root) / results)
        if not broken:
            lines.append(f"Decided: the driver finished after look {last['look']} ({last['seeds']} seeds)")
            return lines
        # The looks no longer stand on their runs: a plain `snakemake` would make the report from look 1's alone.
        command = (shlex.join(state["command"]) if state.get("command") else
                   f"snakemake --configfile <the grid's config files> {Path(root) / decide_dir(results) / LOOK}")
        remove = [f for _, _, files in broken for f in files]
        lines.append(f"Decided after look {last['look']}, but {len(broken)} run{'s' if len(broken) > 1 else ''} its "
                     f"looks read {'are' if len(broken) > 1 else 'is'} missing or broken:")
        lines += [f"  {key}: {wrong}" for key, wrong, _ in broken]
        lines.append("  make them and the report again with the last look's runs: "
                     + (f"rm {' '.join(remove)}; then " if remove else "") + f"`{command}`; then `linvit decide` "
                     f"checks that every look reads as it was decided")
        return lines
    look = state["next"]["look"]
    before = len(jobs({**base, "added_seeds": done[-1]["added"] if done else []}))
    now = len(jobs({**base, "added_seeds": state["next"]["added"]}))
    lines.append(f"Look {look} of {len(looks)} ({looks[look - 1]} seeds): "
                 + ("the grid as configured" if look == 1 else f"adds {now - before} jobs to look {look - 1}'s"))
    waiting = state["next"].get("waiting", [])
    if waiting:
        these = seed_sequence(config, looks[look - 1])[looks[look - 2]:]
        lines += [f"  {test_id}: waits for seeds {these[0]}-{these[-1]} of its roles" for test_id in waiting]
    if look < len(looks) and (waiting or look == 1):
        nxt = seed_sequence(config, looks[look])[looks[look - 1]:]
        if look == 1:
            lines.append(f"  look 2 adds seeds {nxt[0]}-{nxt[-1]} to the roles of the tests still undecided after "
                         f"look 1 (not known yet)")
        else:  # the roles this look trains, each given the next look's seeds too
            added = state["next"]["added"]
            more = with_seeds(added, [tuple(a[k] for k in RUN_KEYS) for a in added], nxt)
            after = len(jobs({**base, "added_seeds": more}))
            lines.append(f"  look {look + 1} would add {after - now} jobs (seeds {nxt[0]}-{nxt[-1]}) if they stay "
                         f"undecided")
    return lines


# --- the driver's own inputs and its Snakemake: a dry run, signals, the lock's holder, the state's shape ---
DRY_RUN = ("-n", "--dry-run", "--dryrun")
FLAGS = "tkfFlSDpa"  # Snakemake's short options that take no value (so `-pn` is -p -n)


def is_dry_run(args: list[str]) -> bool:
    """Whether Snakemake's arguments ask for a dry run: -n, --dry-run, --dryrun, -n among short flags
    (`-pn`, `-np`), or the dryrun executor."""
    for i, a in enumerate(args):
        if a in DRY_RUN or a in ("--executor=dryrun", "-edryrun"):
            return True
        if a.startswith("-") and not a.startswith("--") and "n" in a and set(a[1:a.index("n")]) <= set(FLAGS):
            return True
        if a in ("--executor", "-e") and args[i + 1:i + 2] == ["dryrun"]:
            return True
    return False


class Interrupted(KeyboardInterrupt):
    """The driver was stopped by a signal, after its Snakemake stopped (linvit's CLI prints it in one line)."""


def run_snakemake(cmd: list[str], lock=None, started=None) -> int:
    """Run Snakemake in a process group of its own (its jobs join it) and wait for it; its exit code.

    SIGINT, SIGTERM or SIGHUP to the driver (Ctrl-C at its terminal, a scheduler, a closed terminal) goes
    to that group as one SIGINT, as Ctrl-C would to a Snakemake run by hand: Snakemake stops its jobs and
    removes its locks, and the driver waits for it to exit, then raises Interrupted. (Snakemake in the
    driver's own group would get a terminal's Ctrl-C twice; a SIGTERM makes it wait for its running jobs.)
    A second signal kills the group. `lock`: a file Snakemake holds open too; `started(pid)` is called
    once it runs."""
    child: subprocess.Popen | None = None
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        if child is not None:
            _stop(child, len(got))

    watched = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN]
    previous = {s: signal.signal(s, forward) for s in watched}
    try:
        child = subprocess.Popen(cmd, pass_fds=(lock.fileno(),) if lock is not None else (), process_group=0)
        if got:  # a signal came while it started
            _stop(child, len(got))
        elif started is not None:
            started(child.pid)
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
    if got:
        name = signal.Signals(got[0]).name
        if len(got) > 1:
            raise Interrupted(f"{name} twice: killed Snakemake (pid {child.pid}) and its jobs; its locks may be "
                              f"left in .snakemake/locks (`linvit status` says), then rerun linvit decide")
        raise Interrupted(f"{name}: Snakemake (pid {child.pid}) stopped its jobs and exited {code}; rerun "
                          f"linvit decide to resume")
    return code


def _stop(child: subprocess.Popen, times: int) -> None:
    sig = signal.SIGINT if times == 1 else signal.SIGKILL
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        return
    # (os.write: a signal handler may run while the main thread is inside print)
    os.write(2, (f"decide: stopping Snakemake (pid {child.pid}) and its jobs, waiting for it to remove its locks "
                 f"(a second signal kills them)\n" if times == 1 else
                 f"decide: killed Snakemake (pid {child.pid}) and its jobs\n").encode())


def record_snakemake(lock, pid: int) -> None:
    """Add the running Snakemake's pid to driver.lock's line, so that a refusal names it if the driver is
    killed and it runs on, holding the lock."""
    lock.seek(0)
    line = lock.readline().split(";")[0].strip()
    lock.truncate(0)
    lock.write(f"{line}; snakemake pid {pid}\n")
    lock.flush()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


def lock_holder(text: str) -> str:
    """Who holds the driver's lock, from what driver.lock records ('pid D on HOST since ...; snakemake pid
    S'): the driver where it lives; where the driver is gone (killed with SIGKILL), the Snakemake it left
    running, which holds the lock until it ends."""
    first = re.match(r"pid (\d+) on (\S+)", text)
    snake = re.search(r"snakemake pid (\d+)", text)
    if first is None:
        return text or "another process"
    driver, host = int(first[1]), first[2]
    if host != socket.gethostname():
        return f"{text}: on another machine, check there"
    snakemake = int(snake[1]) if snake else None
    if alive(driver):
        return f"linvit decide pid {driver} on {host}" + (
            f", running Snakemake pid {snakemake}" if snakemake and alive(snakemake) else "")
    if snakemake and alive(snakemake):
        return (f"Snakemake pid {snakemake} holds it, left running when linvit decide pid {driver} was killed; "
                f"wait for it to end or stop it (kill -INT {snakemake}), then rerun")
    return text


def check_state(state, path, looks=None, config: dict | None = None) -> dict:
    """`state` as the driver writes it, else a DecideError naming `path`: a mapping with the plan, the looks
    recorded (1, 2, ...) and the next look (or null once done). With `looks` (the plan's seeds at each look):
    every look within the plan. With `config`: every run a look lists has seeds of the plan's seed sequence
    up to that look (the driver gives a look no other)."""
    def bad(why: str) -> DecideError:
        return DecideError(f"{path}: {why}; the driver writes this file: restore it, or move it away to start the "
                           f"sequence again")

    if not isinstance(state, dict):
        raise bad(f"a JSON {type(state).__name__}, not the driver's record of the looks (an object)")
    missing = [k for k in ("plan", "looks", "next") if k not in state]
    if missing:
        raise bad(f"lacks {', '.join(repr(k) for k in missing)}")
    plan, records, nxt = state["plan"], state["looks"], state["next"]
    if not (isinstance(plan, dict) and isinstance(plan.get("looks"), list) and plan["looks"]
            and all(isinstance(n, int) for n in plan["looks"])):
        raise bad("its 'plan' has no list of looks")
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise bad("its 'looks' is not a list of looks")
    for i, r in enumerate(records, 1):
        lacks = [k for k in ("look", "seeds", "added", "tests") if k not in r]
        if lacks:
            raise bad(f"its look {i} lacks {', '.join(repr(k) for k in lacks)}")
        if r["look"] != i:
            raise bad(f"its look {i} is numbered {r['look']!r}")
    if nxt is None and not records:
        raise bad("it records no look and no next look")
    if nxt is not None and not (isinstance(nxt, dict) and isinstance(nxt.get("look"), int)
                                and isinstance(nxt.get("added"), list)):
        raise bad("its 'next' is not a look (with 'look' and 'added')")
    looks = list(looks or plan["looks"])
    last = nxt["look"] if nxt is not None else len(records)
    if last > len(looks):
        raise bad(f"it names look {last}, beyond the plan's {len(looks)} looks")
    if nxt is not None and nxt["look"] != len(records) + 1:
        raise bad(f"its next look is {nxt['look']}, after {len(records)} recorded")
    for k, added in [*((r["look"], r["added"]) for r in records), *([(nxt["look"], nxt["added"])] if nxt else [])]:
        for a in added if isinstance(added, list) else [None]:
            if not (isinstance(a, dict) and all(key in a for key in (*RUN_KEYS, "seeds")) and isinstance(a["seeds"], list)
                    and all(isinstance(s, int) and not isinstance(s, bool) for s in a["seeds"])):
                raise bad(f"look {k} adds a run that is not {', '.join(RUN_KEYS)} and a list of seeds: {a!r}")
            if config is not None:
                allowed = seed_sequence(config, looks[k - 1])
                wrong = [s for s in a["seeds"] if s not in allowed]
                if wrong:
                    run = "/".join(str(a[key]) for key in RUN_KEYS)
                    raise bad(f"look {k} lists seed {wrong[0]} for {run}, not among the plan's {looks[k - 1]} seeds "
                              f"up to look {k} ({', '.join(map(str, allowed))})")
    return state


def lock_owners(root: str | Path = ".", results: str | Path = RESULTS) -> str:
    """The live processes driver.lock in `root` names (a linvit decide driver, the Snakemake it runs), on
    this machine; '' where none lives. For `linvit status`, which never advises `snakemake --unlock` while
    one of them may still write in the folder. (Read from the file, never by taking the lock: a driver
    starting at that moment would be refused.)"""
    try:
        text = (Path(root) / decide_dir(results) / LOCK).read_text().strip()
    except OSError:
        return ""
    first = re.match(r"pid (\d+) on (\S+)", text)
    if first is None or first[2] != socket.gethostname():
        return ""
    snake = re.search(r"snakemake pid (\d+)", text)
    live = [f"linvit decide (pid {first[1]})"] if _runs(int(first[1]), "decide") else []
    live += [f"the Snakemake it ran (pid {snake[1]})"] if snake and _runs(int(snake[1]), "snakemake") else []
    return " and ".join(live)


def _runs(pid: int, word: str) -> bool:
    """Whether process `pid` lives here and `word` is in its command line."""
    try:
        return word in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
