"""What `linvit status` says of a sequential run (`linvit decide`): the plan, the look, the tests waiting and
the jobs they add; after the last look, whether every run the looks read is still there and whole."""

from __future__ import annotations

import shlex
from pathlib import Path

from .config import seed_sequence
from .decide_state import LOOK, RUN_KEYS, read_runs, read_state, with_seeds
from .grid import RESULTS, decide_dir


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
