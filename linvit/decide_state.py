"""A sequential run's state (`linvit decide`): results/decide/state.json's one reader and one writer, and what
the report, `linvit status` and the driver read of it: the looks recorded, the runs each added and read, the
lock's live holders. Plain files, no torch, no pandas; below the report, the status and the driver.

    results/decide/state.json    the plan, each look's record (its added runs, failed runs, every deciding
                                 test's outcome and statistic), the settings that decide, the next look
    results/decide/look.yaml     the current look's runs as Snakemake config (written by the driver)
    results/decide/driver.lock   flock'ed by the driver and its Snakemake; its line names them
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

from .config import seed_sequence
from .grid import RESULTS, decide_dir
from .io import write_text

STATE, LOOK, LOCK = "state.json", "look.yaml", "driver.lock"  # in grid.decide_dir


class DecideError(ValueError):
    """A refusal or a broken run, in one line (linvit's CLI prints it without a traceback)."""


RUN_KEYS = ("dataset", "size", "variant", "init", "design", "budget")  # an added_seeds entry: its run, then seeds


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


def write_state(path: Path, state: dict) -> None:
    """state.json, atomically (the driver's one writer)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(state, indent=2, sort_keys=True) + "\n")


def with_seeds(added: list[dict], roles, seeds: list[int]) -> list[dict]:
    """`added` (added_seeds entries) with `seeds` added to each of `roles` (tuples in RUN_KEYS order); a role
    not there yet is appended. Earlier entries keep their order and seeds."""
    runs = {tuple(a[k] for k in RUN_KEYS): list(a["seeds"]) for a in added}
    for role in roles:
        runs[tuple(role)] = sorted(set(runs.get(tuple(role), [])) | set(seeds))
    return [{**dict(zip(RUN_KEYS, role)), "seeds": s} for role, s in runs.items()]


def _added_now(state: dict) -> list[dict]:
    if state.get("next"):
        return state["next"]["added"]
    return state["looks"][-1]["added"] if state["looks"] else []


def current_config(config: dict, root: str | Path = ".", results: str | Path = RESULTS) -> dict:
    """`config` with the runs the sequential driver has added so far in `root` (its current look's), so that
    `linvit status` lists the jobs Snakemake runs now. `config` itself where no driver ran."""
    state = read_state(root, results)
    if state is None:
        return config
    return {**config, "added_seeds": _added_now(state)}


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


def stamp(path: Path) -> tuple | None:
    """What tells a file written again (an atomic write is a new inode): None where it does not exist."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


def _runs(pid: int, word: str) -> bool:
    """Whether process `pid` lives here and `word` is in its command line."""
    try:
        return word in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
