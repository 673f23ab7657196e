"""The claims read along the grid's axes: per claim and axis, where it holds, fails or stays undecided, with the
interval of the test that decides each cell, and the grid's design (the full product, around a center, listed
cells) with what it cannot see (linvit.claims.axes); the verdict at each budget; and the positive control, each
statistic on softmax students beside each linear variant."""

from __future__ import annotations

from linvit.claims.axes import AROUND, AXES, PRODUCT, center, grid_design, reading_tests, readings
from linvit.claims.table import claim_cells, linear_variants
from linvit.claims.verdicts import CONTROL_NARROWED, NOT_EVALUABLE, CellVerdict, ClaimVerdict
from linvit.config import budgets
from linvit.grid import CONTROL_VARIANT
from linvit.report.statistic_text import STATISTICS, interval

_AXIS = {"datasets": "dataset", "sizes": "size", "variants": "variant", "budgets": "budget"}


def design_markdown(config: dict) -> str:
    """Which design the grid used and what it cannot see."""
    design = grid_design(config)
    if design == PRODUCT:
        return ("The grid is the full product of its axes: each value of an axis is read over every cell that has "
                "it, at every value of the other axes.")
    listed = sum(c[2] != CONTROL_VARIANT for c in claim_cells(config))
    if design == AROUND:
        mid = center(config)
        return (f"The grid varies one axis at a time around the center `{mid['dataset']}/{mid['size']}/"
                f"{mid['variant']}/steps{mid['budget']}` (`cells: {{around: ...}}`, {listed} linear cells): each "
                "axis is read along the cells that vary it, the other axes at the center's values. One axis at a "
                "time: interactions between axes are not seen (no cell moves two axes from the center, so a claim "
                "that holds along each axis may still fail where two of them change together).")
    product = len(config["targets"]) * len(config["sizes"]) * len(linear_variants(config)) * len(budgets(config))
    return (f"The grid lists its cells (`cells: [...]`, {listed} of the product's {product} linear cells): each "
            "value of an axis is read over the listed cells that have it, which may differ in the other axes too, "
            "so a difference between two values is not that axis's alone; combinations not listed are not seen.")


def axes_markdown(verdicts: list[ClaimVerdict], config: dict) -> str:
    """Per claim C1-C3 and axis the grid varies (budgets included), each value of the axis: where the claim holds,
    fails or stays undecided, with the interval of each test that decides it there (under a sequential plan, its
    last look's repeated interval), after the grid's design. '' where the grid varies no axis."""
    found = readings(verdicts, config)
    if not found:
        return ""
    lines = [f"- {r.claim} by {_AXIS[r.axis]}: " + ", ".join(_value(r.axis, x, cells) for x, cells in r.values)
             for r in found]
    repeated = " (its last look's repeated interval)" if config.get("sequential") is not None else ""
    budget = ("\n\nAlong the budgets, the figure `claims_by_budget` draws each deciding test's interval at each budget "
              "against its threshold in one cell (the grid's center, else its linear cell with the most budgets), "
              "beside `accuracy_by_budget`: do the verdicts survive longer training?"
              if any(r.axis == "budgets" for r in found) else "")
    return (design_markdown(config) + " Each claim along each axis the grid varies, with the interval of each "
            f"test that decides it in each cell{repeated}:\n\n" + "\n".join(lines) + budget)


def _value(axis: str, value, cells: list[CellVerdict]) -> str:
    """'elu fails (attn_alone +49.6% [+25.1%, +69.6%])'; with several cells, each named by what tells them apart."""
    label = f"{value} steps" if axis == "budgets" else str(value)
    if not cells:
        return f"{label}: no linear cell"
    if len(cells) == 1:
        return f"{label} {cells[0].outcome} ({_tests(cells[0])})"
    column = dict(AXES)[axis]
    apart = [f for _, f in AXES if f != column and len({getattr(c, f) for c in cells}) > 1]
    outcomes = list(dict.fromkeys(c.outcome for c in cells))
    same = len(outcomes) == 1
    word = outcomes[0] if same else "mixed"  # each cell says its own
    each = ["/".join(f"steps{c.budget}" if f == "budget" else str(getattr(c, f)) for f in apart)
            + ("" if same else f" {c.outcome}") + f": {_tests(c)}" for c in cells]
    return f"{label} {word} ({'; '.join(each)})"


def _tests(cell: CellVerdict) -> str:
    """The tests that decide the cell, each with its interval ('attn_alone -10.0% [...] and attn_on_top ...')."""
    tests = reading_tests(cell) if cell.outcome != NOT_EVALUABLE else []
    return " and ".join(f"{t.name} {interval(t)}" for t in tests) or cell.why or "no test evaluated"


def control_markdown(verdicts: list[ClaimVerdict], config: dict) -> str:
    """The positive control: each attention and MLP statistic on softmax students (no boundary) beside
    each linear variant, per dataset, size and budget."""
    if CONTROL_VARIANT not in config["variants"]:
        return ("The grid has no softmax control: add `softmax` to `variants` to see how much the attention "
                "carries between softmax ViTs (the Attention Transfer setting) beside how much it carries across "
                "the softmax-to-linear boundary.")
    variants = [CONTROL_VARIANT, *linear_variants(config)]
    header = ["dataset", "size", "budget", "statistic", *[f"{v} (control)" if v == CONTROL_VARIANT else v
                                                          for v in variants]]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in verdicts:
        if v.claim == "C4":
            continue
        cells = {(c.dataset, c.size, c.budget, c.variant): c for c in [*v.controls, *v.cells]}
        for dataset, size, budget in dict.fromkeys((c.dataset, c.size, c.budget) for c in v.controls):
            for name in [t.name for t in v.controls[0].tests] if v.controls[0].tests else []:
                if name in ("gap_closed",):
                    continue
                control = cells.get((dataset, size, budget, CONTROL_VARIANT))
                narrowed = control.test(name) if control else None
                if narrowed is not None and narrowed.note.startswith(CONTROL_NARROWED):
                    continue  # the control does not run this statistic's strategies
                values = []
                for variant in variants:
                    cell = cells.get((dataset, size, budget, variant))
                    test = cell.test(name) if cell else None
                    values.append("n/a" if test is None or test.outcome == NOT_EVALUABLE else interval(test))
                rows.append(f"| {dataset} | {size} | {budget} | {v.claim} {STATISTICS[name].label} | "
                            + " | ".join(values) + " |")
    plan = ("" if config.get("sequential") is None else
            " Under the sequential plan a deciding statistic's interval is its last look's repeated interval, and a "
            "reported one's a fixed-n t interval on the seeds the stopping rule chose, whose nominal level does not "
            "hold under that rule.")
    return ("The same statistics on softmax students (softmax-to-softmax: the Attention Transfer setting, where "
            "attention weights are reported to transfer) beside each linear variant, with their intervals. If the "
            "attention's share is large in the control and small across the boundary, the boundary is what stops "
            f"it; if it is small in both, nothing transfers at this scale.{plan}\n\n" + "\n".join(rows))


def budget_markdown(verdicts: list[ClaimVerdict]) -> str:
    """Claim x budget: the verdict at each budget."""
    budgets_ = [b["budget"] for b in verdicts[0].by_budget] if verdicts else []
    rows = ["| claim | " + " | ".join(f"{b} steps" for b in budgets_) + " |", "|---|" + "---|" * len(budgets_)]
    for v in verdicts:
        rows.append(f"| {v.claim} | " + " | ".join(b["verdict"] for b in v.by_budget) + " |")
    return "\n".join(rows)
