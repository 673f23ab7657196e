"""The budget, fidelity-by-block and attention-map figures on small synthetic runs and records."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import AxesImage, imread
from scipy import stats as sps

from linvit.report import figures
from linvit.report.figures import accuracy_by_budget, attention_maps, fidelity_by_block

CONFIG = {"targets": ["dsA", "dsB"], "sizes": ["micro", "mini"], "variants": ["linA", "linB"],
          "inits": ["random", "copy_all", "distilled"], "seeds": [0, 1], "distills": ["kl", "mse"]}
DEPTH = {"micro": 4, "mini": 6}
BUDGETS = [100, 400, 1600]
DESIGNS = {"random": ["none"], "copy_all": ["none"], "distilled": ["kl", "mse"]}


def accuracy(init: str, design: str, budget: int, seed: int) -> float:
    base = {"random": 0.3, "copy_all": 0.5, "distilled": 0.6}[init] + (0.05 if design == "mse" else 0)
    return base + 0.05 * math.log2(budget / 100) / 4 + 0.01 * seed


def fidelity(init: str, design: str, block: int, seed: int) -> tuple[float, float, float]:
    kl = {"random": 1.0, "copy_all": 0.5, "distilled": 0.1}[init] * (1 + block) * (2 if design == "mse" else 1)
    return kl + 0.01 * seed, kl / 3, 1 / (1 + kl)


def runs_frame(budgets=BUDGETS, drop=(("dsB", "mini", "linB"),), depth=DEPTH) -> pd.DataFrame:
    rows = []
    cols = {f"fidelity_{m}_l{k}" for m in ("kl", "js", "corr") for k in range(max(depth.values()))}
    for dataset in CONFIG["targets"]:
        for size in CONFIG["sizes"]:
            for seed in CONFIG["seeds"]:
                for budget in budgets:
                    ref = {"dataset": dataset, "size": size, "variant": "softmax", "init": "reference",
                           "design": "none", "budget": budget, "seed": seed, "status": "ok",
                           "test_acc": 0.8 + 0.01 * seed}
                    rows.append(ref)
                for variant in CONFIG["variants"]:
                    if (dataset, size, variant) in drop:
                        continue
                    for init in CONFIG["inits"]:
                        for design in DESIGNS[init]:
                            for budget in budgets:
                                row = {"dataset": dataset, "size": size, "variant": variant, "init": init,
                                       "design": design, "budget": budget, "seed": seed, "status": "ok",
                                       "test_acc": accuracy(init, design, budget, seed)}
                                for k in range(depth[size]):
                                    # Fidelity changes with the budget: the figure must use the largest.
                                    kl, js, corr = fidelity(init, design, k, seed)
                                    scale = budget / max(budgets)
                                    row.update({f"fidelity_kl_l{k}": kl * scale, f"fidelity_js_l{k}": js,
                                                f"fidelity_corr_l{k}": corr})
                                rows.append(row)
    frame = pd.DataFrame(rows).reindex(columns=[*rows[0], *sorted(cols)])
    # A diverged run must not count.
    bad = frame.iloc[[0]].assign(status="diverged", test_acc=0.0, variant="linA", init="random")
    return pd.concat([frame, bad], ignore_index=True)


@pytest.fixture
def captured(monkeypatch):
    """The Figure objects the functions save, by file stem."""
    figs = {}
    save = figures.save_figure

    def keep(fig, stem, **kw):
        figs[stem.name] = fig
        return save(fig, stem, **kw)

    monkeypatch.setattr(figures, "save_figure", keep)
    return figs


def check_files(paths, stem, min_px=(200, 200), max_px=(20000, 20000)):
    assert [p.name for p in paths] == [f"{stem}.png", f"{stem}.svg"]
    for p in paths:
        assert p.stat().st_size > 0
    img = imread(paths[0])
    h, w = img.shape[:2]
    assert min_px[0] <= h <= max_px[0] and min_px[1] <= w <= max_px[1], (h, w)
    assert np.ptp(img[..., :3]) > 0.2  # not all one colour
    assert paths[1].read_text().lstrip().startswith("<?xml")
    return img


def all_axes(fig):
    return [ax for ax in fig.get_axes() if ax.get_label() != "<colorbar>"]


def panel_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.get_axes() for t in ax.texts]


def panel(fig, title_start: str):
    found = [ax for ax in fig.get_axes() if ax.get_title().startswith(title_start)]
    assert found, [ax.get_title() for ax in fig.get_axes()]
    return found


def legend_labels(fig) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def test_accuracy_by_budget(tmp_path, captured):
    paths = accuracy_by_budget(runs_frame(), CONFIG, tmp_path)
    check_files(paths, "accuracy_by_budget", min_px=(800, 600))
    fig = captured["accuracy_by_budget"]
    assert len(all_axes(fig)) == 2 * 4  # datasets x (sizes x variants)
    assert panel_texts(fig) == ["no student results"]  # dsB · linB · mini: only the reference
    labels = legend_labels(fig)
    assert labels[:4] == ["random", "copy_all", "distilled [kl]", "distilled [mse]"]
    assert "softmax reference" in labels
    ax = panel(fig, "dsA · linA · micro")[0]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["100", "400", "1600"]
    # One mean line per (init, design) plus the reference's line over budgets; means over the two seeds.
    means = [line for line in ax.get_lines() if len(line.get_xdata()) == 3]
    assert len(means) == 5
    expected = [(accuracy("copy_all", "none", b, 0) + accuracy("copy_all", "none", b, 1)) / 2 for b in BUDGETS]
    assert np.allclose(means[1].get_ydata(), expected)
    assert means[-1].get_linestyle() == "--" and np.allclose(means[-1].get_ydata(), 0.805)


def test_accuracy_by_budget_single_budget_and_empty(tmp_path, captured):
    paths = accuracy_by_budget(runs_frame(budgets=[500]), CONFIG, tmp_path)
    check_files(paths, "accuracy_by_budget")
    ax = panel(captured["accuracy_by_budget"], "dsA · linA · micro")[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["500"]
    lo, hi = ax.get_xlim()
    assert lo < 500 < hi
    # The reference has one budget: a horizontal line across the panel.
    ref = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(ref) == 1 and np.allclose(ref[0].get_ydata(), 0.805)
    # Nothing finished at all: every panel says so, and the files are still written.
    empty = runs_frame().assign(status="missing")
    check_files(accuracy_by_budget(empty, CONFIG, tmp_path / "empty"), "accuracy_by_budget")
    assert panel_texts(captured["accuracy_by_budget"]).count("no results") == 8


def test_accuracy_by_budget_without_design_and_budget_columns(tmp_path):
    frame = runs_frame(budgets=[500]).drop(columns=["design", "budget"])
    check_files(accuracy_by_budget(frame, CONFIG, tmp_path), "accuracy_by_budget")


def test_fidelity_by_block(tmp_path, captured):
    paths = fidelity_by_block(runs_frame(), CONFIG, tmp_path)
    check_files(paths, "fidelity_by_block", min_px=(1200, 600))
    fig = captured["fidelity_by_block"]
    assert len(all_axes(fig)) == 2 * 2 * 4  # (KL, corr) x datasets x (sizes x variants)
    assert panel_texts(fig).count("no results") == 2  # the missing cell, in both rows
    assert legend_labels(fig) == ["random", "copy_all", "distilled [kl]", "distilled [mse]"]  # no reference fidelity
    kl_ax, corr_ax = panel(fig, "dsA · linA · mini · budget 1600")
    assert kl_ax.get_yscale() == "log" and corr_ax.get_yscale() == "linear"
    lines = kl_ax.get_lines()
    assert len(lines) == 4 and list(lines[0].get_xdata()) == list(range(6))
    # At the largest budget, mean over seeds.
    expected = [(fidelity("random", "none", k, 0)[0] + fidelity("random", "none", k, 1)[0]) / 2 for k in range(6)]
    assert np.allclose(lines[0].get_ydata(), expected)
    assert np.allclose(corr_ax.get_lines()[2].get_ydata(), [fidelity("distilled", "kl", k, 0)[2] for k in range(6)])
    # The smaller size has fewer blocks (NaN columns beyond its depth).
    micro = panel(fig, "dsA · linA · micro")[0]
    assert list(micro.get_lines()[0].get_xdata()) == list(range(4))


def test_fidelity_by_block_single_budget_reference_and_missing_columns(tmp_path, captured):
    frame = runs_frame(budgets=[500])
    ref = frame["variant"] == "softmax"
    frame.loc[ref, "fidelity_kl_l0"] = 0.01  # an evaluated reference: drawn dashed
    check_files(fidelity_by_block(frame, CONFIG, tmp_path), "fidelity_by_block")
    assert legend_labels(captured["fidelity_by_block"])[-1] == "softmax reference"
    # Runs without any fidelity columns (not evaluated): every panel says so.
    bare = frame[[c for c in frame.columns if not c.startswith("fidelity_")]]
    check_files(fidelity_by_block(bare, CONFIG, tmp_path / "bare"), "fidelity_by_block")
    assert panel_texts(captured["fidelity_by_block"]).count("no results") == 16


def map_record(dataset, size, variant, init, design, budget, seed, model, heads=4, grid=(7, 7), prefix=1,
               value=None, row="class token"):
    n = prefix + grid[0] * grid[1]
    rng = np.random.default_rng(abs(hash((dataset, size, variant, init, design, budget, seed, model))) % 2**32)
    rows = rng.random((heads, n)) if value is None else np.full((heads, n), value)
    rows = rows / rows.sum(-1, keepdims=True)
    return {"dataset": dataset, "size": size, "variant": variant, "init": init, "design": design,
            "budget": budget, "seed": seed, "row": row, "prefix": prefix, "grid": list(grid),
            "heads": rows.tolist(), "model": model, "block": 3}


def map_records():
    out = []
    for dataset in ("dsA", "dsB"):
        for variant in ("linA", "linB"):
            if (dataset, variant) == ("dsB", "linB"):
                continue  # a missing cell
            for init, design in (("random", "none"), ("distilled", "kl"), ("distilled", "mse")):
                for budget in (100, 400):
                    for seed in (1, 0):
                        out.append(map_record(dataset, "micro", variant, init, design, budget, seed, "teacher"))
                        out.append(map_record(dataset, "micro", variant, init, design, budget, seed, "student"))
    return out


def test_attention_maps(tmp_path, captured):
    records = map_records()
    # A softmax reference's record: its own row under the teacher.
    records.append(map_record("dsA", "micro", "softmax", "reference", "none", 400, 0, "student"))
    # A malformed record (wrong length for its grid): its row says "no results".
    bad = map_record("dsA", "micro", "linA", "broken", "none", 400, 0, "student")
    bad["heads"] = [h[:-3] for h in bad["heads"]]
    records.append(bad)
    paths = attention_maps(records, tmp_path)
    check_files(paths, "attention_maps", min_px=(600, 800), max_px=(6000, 6000))
    fig = captured["attention_maps"]
    texts = panel_texts(fig)
    assert texts.count("no results") == 2  # the missing cell and the malformed record
    labels = [ax.get_ylabel() for ax in fig.get_axes() if ax.get_ylabel()]
    assert labels[:6] == ["teacher", "softmax reference", "random", "distilled\n[kl]", "distilled\n[mse]", "broken"]
    images = [im for ax in fig.get_axes() for im in ax.get_images()]
    # dsA·linA: 5 drawn rows (the broken one is not), dsA·linB 5 (the reference is dsA's), dsB·linA 4; 4 heads.
    assert len(images) == (5 + 5 + 4) * 4
    assert all(isinstance(im, AxesImage) and im.get_array().shape == (7, 7) for im in images)
    # The student shown is the largest budget's first seed, the class token's patch part on the grid.
    expect = map_record("dsA", "micro", "linA", "distilled", "kl", 400, 0, "student")
    first_kl = [im for ax in fig.get_axes() if ax.get_ylabel() == "distilled\n[kl]" for im in ax.get_images()][0]
    assert np.allclose(first_kl.get_array(), np.asarray(expect["heads"][0][1:]).reshape(7, 7))
    # One colour scale per row: 0 to the row's largest patch weight.
    row_max = np.asarray(expect["heads"])[:, 1:].max()
    assert first_kl.get_clim() == pytest.approx((0.0, row_max))


def test_attention_maps_large_grid_stays_readable(tmp_path, captured):
    records = [map_record("dsA", "deit", "linA", "x", "none", 100, 0, "teacher", heads=12, grid=(14, 14))]
    records += [map_record("dsA", "deit", "linA", f"init{i}", "none", 100, 0, "student", heads=12, grid=(14, 14))
                for i in range(9)]
    img = check_files(attention_maps(records, tmp_path), "attention_maps", min_px=(1000, 1200),
                      max_px=(3000, 3000))
    assert img.shape[1] > img.shape[0] * 0.8  # 12 heads wide, 10 rows tall
    assert len([im for ax in captured["attention_maps"].get_axes() for im in ax.get_images()]) == 10 * 12


def test_attention_maps_mean_rows_and_empty(tmp_path, captured):
    records = [map_record("dsA", "micro", "linA", "random", "none", 100, 0, "teacher", prefix=0, row="mean of rows"),
               map_record("dsA", "micro", "linA", "random", "none", 100, 0, "student", prefix=0, row="mean of rows")]
    check_files(attention_maps(records, tmp_path), "attention_maps", min_px=(150, 300))
    assert "mean of rows row" in captured["attention_maps"].subfigs[0]._suptitle.get_text()
    # No records: a figure that says so.
    check_files(attention_maps([], tmp_path / "none"), "attention_maps", min_px=(20, 20))
    assert panel_texts(captured["attention_maps"]) == ["no results"]
    # Only a teacher: its row is drawn.
    check_files(attention_maps(records[:1], tmp_path / "teacher"), "attention_maps", min_px=(50, 300))


# -- accuracy by init and training curves: one category / line per (init, design), largest budget only ------

LABELS = ["random", "copy_all", "distilled [kl]", "distilled [mse]"]


def budget_runs(budgets=BUDGETS) -> pd.DataFrame:
    """runs_frame whose reference also changes with the budget (so a mixed budget would show)."""
    frame = runs_frame(budgets=budgets)
    ref = frame["variant"] == "softmax"
    frame.loc[ref, "test_acc"] += frame.loc[ref, "budget"] / 100000
    return frame


def curves_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Five evaluations per finished run, every budget/4 steps, rising to the run's final accuracy."""
    rows = []
    for run in runs[runs["status"] == "ok"].itertuples():
        for k in range(5):
            rows.append({**{c: getattr(run, c) for c in figures.ID_COLUMNS}, "step": k * run.budget // 4,
                         "epoch": k, "test_acc": run.test_acc * (k + 1) / 5, "elapsed_s": float(k)})
    return pd.DataFrame(rows)


def test_plotted_is_the_largest_budget_per_init_and_design():
    runs = budget_runs()
    shown = figures.plotted(runs, CONFIG)
    assert shown.budget == 1600 and set(shown.data["budget"]) == {1600}
    assert shown.lines == [("random", "none"), ("copy_all", "none"), ("distilled", "kl"), ("distilled", "mse")]
    assert shown.labels == LABELS
    students = shown.data[(shown.data["variant"] == "linA") & (shown.data["status"] == "ok")]
    # datasets x sizes x seeds
    assert students.groupby("line").size().to_dict() == {label: 2 * 2 * 2 for label in LABELS}
    assert set(shown.data.loc[shown.data["variant"] == "softmax", "line"]) == {"reference"}
    # An explicit budget.
    assert set(figures.plotted(runs, CONFIG, budget=400).data["budget"]) == {400}
    # A table without design and budget columns: design "none", one budget (NaN), every row.
    old = figures.plotted(runs_frame(budgets=[500]).drop(columns=["design", "budget"]), CONFIG)
    assert math.isnan(old.budget) and old.labels == ["random", "copy_all", "distilled"]
    assert len(old.data) == len(runs_frame(budgets=[500]))


def seed_points(ax) -> dict[int, list[float]]:
    """The stripplot's points of a panel by category index (x rounded: jitter is under 0.5)."""
    out = {}
    for coll in ax.collections:
        for x, y in coll.get_offsets():
            out.setdefault(int(round(x)), []).append(round(float(y), 6))
    return {k: sorted(v) for k, v in out.items()}


def test_accuracy_by_init_largest_budget_designs_apart(tmp_path, captured):
    runs = budget_runs()
    paths = figures.accuracy_by_init(runs, CONFIG, tmp_path)
    check_files(paths, "accuracy_by_init", min_px=(800, 400))
    fig = captured["accuracy_by_init"]
    assert fig._suptitle.get_text() == "Largest budget: 1600 steps (student training)"
    ax = panel(fig, "dsA · linA · micro")[0]
    assert ax.get_ylabel() == "test accuracy at 1600 steps"
    assert [t.get_text() for t in ax.get_xticklabels()] == LABELS
    # Seed points: each (init, design) at its own category, the two seeds at 1600 steps only.
    expected = {i: sorted(round(accuracy(init, design, 1600, s), 6) for s in (0, 1))
                for i, (init, design) in enumerate([("random", "none"), ("copy_all", "none"),
                                                    ("distilled", "kl"), ("distilled", "mse")])}
    assert seed_points(ax) == expected
    # The reference at the same budget (mean over seeds), dashed.
    ref = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(ref) == 1 and np.allclose(ref[0].get_ydata(), 0.805 + 1600 / 100000)
    assert legend_labels(fig)[-1] == "softmax reference"
    assert panel_texts(fig) == []  # dsB · linB · mini: no students, but its reference line


def test_accuracy_by_init_older_table_and_grid_budget(tmp_path, captured):
    # Without design and budget columns: one category per init, no budget in the labels.
    old = runs_frame(budgets=[500]).drop(columns=["design", "budget"])
    check_files(figures.accuracy_by_init(old, CONFIG, tmp_path), "accuracy_by_init")
    fig = captured["accuracy_by_init"]
    ax = panel(fig, "dsA · linA · micro")[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["random", "copy_all", "distilled"]
    assert ax.get_ylabel() == "test accuracy" and fig._suptitle is None
    # The old table cannot tell designs apart: kl and mse rows are both "distilled" (2 designs x 2 seeds).
    assert len(seed_points(ax)[2]) == 4
    # The largest budget is the grid's (every expected cell), not the largest with finished runs.
    runs = budget_runs()
    runs.loc[runs["budget"] == 1600, "status"] = "missing"
    figures.accuracy_by_init(runs, CONFIG, tmp_path / "missing")
    fig = captured["accuracy_by_init"]
    assert panel_texts(fig).count("no results") == 8
    assert fig._suptitle.get_text() == "Largest budget: 1600 steps (student training)"


def test_training_curves_largest_budget_line_per_init_and_design(tmp_path, captured):
    runs = budget_runs()
    paths = figures.training_curves(curves_frame(runs), CONFIG, tmp_path)
    check_files(paths, "training_curves", min_px=(800, 600))
    fig = captured["training_curves"]
    assert fig._suptitle.get_text() == "Largest budget: 1600 steps (student training)"
    assert legend_labels(fig) == [*LABELS, "softmax reference"]
    ax = panel(fig, "dsA · linA · micro")[0]
    lines = ax.get_lines()
    students = [line for line in lines if line.get_linestyle() != "--"]
    reference = [line for line in lines if line.get_linestyle() == "--"]
    assert len(students) == 4 and len(reference) == 1
    # Only the 1600-step curves: steps 0, 400, ..., 1600, mean over seeds; one colour per (init, design).
    for line, (init, design) in zip(students, [("random", "none"), ("copy_all", "none"), ("distilled", "kl"),
                                               ("distilled", "mse")]):
        assert list(line.get_xdata()) == [0, 400, 800, 1200, 1600]
        final = (accuracy(init, design, 1600, 0) + accuracy(init, design, 1600, 1)) / 2
        assert np.allclose(line.get_ydata(), [final * (k + 1) / 5 for k in range(5)])
    assert len({line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color())
                for line in students}) == 4
    assert list(reference[0].get_xdata()) == [0, 400, 800, 1200, 1600]
    assert np.isclose(reference[0].get_ydata()[-1], 0.805 + 1600 / 100000)
    # An explicit budget draws that budget's curves.
    figures.training_curves(curves_frame(runs), CONFIG, tmp_path / "b400", budget=400)
    ax = panel(captured["training_curves"], "dsA · linA · micro")[0]
    assert all(max(line.get_xdata()) == 400 for line in ax.get_lines())


def test_write_figures_share_the_grid_budget_and_read_older_tables(tmp_path, captured):
    runs = budget_runs()
    curves = curves_frame(runs)
    paths = figures.write_figures(runs, curves, CONFIG, tmp_path)
    assert [p.name for p in paths] == ["accuracy_by_init.png", "accuracy_by_init.svg",
                                       "training_curves.png", "training_curves.svg"]
    ax = panel(captured["training_curves"], "dsA · linA · micro")[0]
    assert all(max(line.get_xdata()) == 1600 for line in ax.get_lines())
    # Older runs.csv / curves.csv without design and budget columns still draw.
    old_runs = runs_frame(budgets=[500])
    old_curves = curves_frame(old_runs).drop(columns=["design", "budget"])
    paths = figures.write_figures(old_runs.drop(columns=["design", "budget"]), old_curves, CONFIG, tmp_path / "old")
    for stem in ("accuracy_by_init", "training_curves"):
        check_files([p for p in paths if p.stem == stem], stem)
    fig = captured["training_curves"]
    assert legend_labels(fig) == ["random", "copy_all", "distilled", "softmax reference"]
    assert fig._suptitle is None


# -- intervals over seeds, gap closed, cost and throughput ------------------------------------------------

DISTILL_STEPS, DISTILL_TIME = 50, 5.0
THROUGHPUT = {"linA": 1000.0, "linB": 2000.0, "softmax": 500.0}


def cost_runs() -> pd.DataFrame:
    """budget_runs with what runs.csv holds for cost: training seconds (budget/10 + seed), the
    distillation's steps and seconds for the distilled init (0 otherwise), measured throughput."""
    runs = budget_runs()
    distilled = runs["init"] == "distilled"
    return runs.assign(train_time_s=runs["budget"] / 10 + runs["seed"],
                       distill_steps=np.where(distilled, DISTILL_STEPS, 0),
                       distill_time_s=np.where(distilled, DISTILL_TIME, 0.0),
                       throughput_img_s=runs["variant"].map(THROUGHPUT) + 10 * runs["seed"])


def two_point_lines(ax) -> list[tuple[list, list]]:
    return [(list(line.get_xdata()), [round(float(y), 6) for y in line.get_ydata()]) for line in ax.get_lines()
            if len(line.get_xdata()) == 2 and line.get_linestyle() != "--"]


def t_interval(values, level=0.95) -> list[float]:
    """mean -+ t(1 - alpha, n - 1) x sd / sqrt(n), by hand (scipy.stats)."""
    x = np.asarray(values, dtype=float)
    half = sps.t.ppf(1 - (1 - level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return [round(float(x.mean() - half), 6), round(float(x.mean() + half), 6)]


def test_accuracy_by_init_draws_the_claims_t_interval_over_seeds(tmp_path, captured):
    runs = budget_runs()
    paths = figures.accuracy_by_init(runs, CONFIG, tmp_path / "a")
    ax = panel(captured["accuracy_by_init"], "dsA · linA · micro")[0]
    # The claims' t interval over the two seeds (1 degree of freedom: t = 12.7), not a percentile
    # bootstrap, which with two seeds spans just seed 0 to seed 1 (and covers far less than 95%).
    for i, (x, y) in enumerate(two_point_lines(ax)):
        init, design = [("random", "none"), ("copy_all", "none"), ("distilled", "kl"), ("distilled", "mse")][i]
        seeds = [accuracy(init, design, 1600, s) for s in (0, 1)]
        assert x == [i, i] and y == pytest.approx(t_interval(seeds), abs=1e-6)
        assert y[0] < min(seeds) and y[1] > max(seeds)
    assert "mean, 95% t interval over seeds" in legend_labels(captured["accuracy_by_init"])
    # At the config's level: 90% intervals are narrower.
    figures.accuracy_by_init(runs, {**CONFIG, "claims": {"level": 0.9}}, tmp_path / "c")
    narrow = two_point_lines(panel(captured["accuracy_by_init"], "dsA · linA · micro")[0])[0][1]
    assert narrow == pytest.approx(t_interval([accuracy("random", "none", 1600, s) for s in (0, 1)], 0.9), abs=1e-6)
    assert "mean, 90% t interval over seeds" in legend_labels(captured["accuracy_by_init"])
    # The strip jitter is seeded: drawing again gives the same files, byte for byte in both formats (the
    # SVG's clip-path ids salted with a fixed salt, not matplotlib's fresh uuid), so a committed report
    # regenerates identically; and the caller's global numpy random state is left as it was.
    state = np.random.get_state()[1].copy()
    again = figures.accuracy_by_init(runs, CONFIG, tmp_path / "b")
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
    assert (np.random.get_state()[1] == state).all()


def summary_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """What linvit.report.tables.summarize gives the heatmap: per cell and budget the mean accuracy and
    gap_closed against random and the reference of the same budget (NaN for the reference)."""
    keys = ["dataset", "size", "variant", "init", "design", "budget"]
    summary = runs[runs["status"] == "ok"].groupby(keys, as_index=False)["test_acc"].mean()
    means = summary.set_index(keys)["test_acc"]
    gaps = []
    for r in summary.itertuples():
        random = means.get((r.dataset, r.size, r.variant, "random", "none", r.budget), math.nan)
        reference = means[(r.dataset, r.size, "softmax", "reference", "none", r.budget)]
        gaps.append(math.nan if r.variant == "softmax" else (r.test_acc - random) / (reference - random))
    return summary.assign(gap_closed=gaps)


def test_gap_closed_heatmap_largest_budget_annotated_nan_empty(tmp_path, captured):
    runs = budget_runs()
    summary = summary_frame(runs)
    check_files(figures.gap_closed_heatmap(summary, CONFIG, tmp_path), "gap_closed_heatmap", min_px=(300, 600))
    fig = captured["gap_closed_heatmap"]
    assert fig._suptitle.get_text() == "Gap closed at the largest budget: 1600 steps (student training)"
    top = summary[summary["budget"] == 1600]
    for dataset, size in [("dsA", "micro"), ("dsB", "mini")]:
        ax = panel(fig, f"{dataset} · {size}")[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["linA", "linB"]
        assert [t.get_text() for t in ax.get_xticklabels()] == LABELS
        cell = top[(top["dataset"] == dataset) & (top["size"] == size) & (top["variant"] != "softmax")]
        expected = sorted(f"{g:.2f}" for g in cell["gap_closed"])
        assert sorted(t.get_text() for t in ax.texts) == expected
    # dsB · mini has no linB students: that row is NaN, drawn empty (4 annotations, not 8).
    assert len(panel(fig, "dsB · mini")[0].texts) == 4 and len(panel(fig, "dsA · micro")[0].texts) == 8
    # Without the random role no gap is defined: every panel says so.
    figures.gap_closed_heatmap(summary.assign(gap_closed=math.nan), CONFIG, tmp_path / "nan")
    assert panel_texts(captured["gap_closed_heatmap"]).count(
        "no gap closed (needs the random role and the reference)") == 4


def test_cost_to_accuracy_adds_distillation_and_uses_wall_clock(tmp_path, captured):
    runs = cost_runs()
    check_files(figures.cost_to_accuracy(runs, CONFIG, tmp_path), "cost_to_accuracy", min_px=(800, 600))
    fig = captured["cost_to_accuracy"]
    steps_ax, seconds_ax = panel(fig, "dsA · linA · micro")
    assert steps_ax.get_xlabel() == "student + distillation steps" and seconds_ax.get_xlabel() == "train + distill seconds"
    mean_lines = lambda ax: [line for line in ax.get_lines() if line.get_marker() == "o"]
    lines = mean_lines(steps_ax)
    # random, copy_all, distilled [kl], distilled [mse], then the reference (dashed).
    assert [list(line.get_xdata()) for line in lines] == [BUDGETS, BUDGETS, [b + DISTILL_STEPS for b in BUDGETS],
                                                          [b + DISTILL_STEPS for b in BUDGETS], BUDGETS]
    assert lines[-1].get_linestyle() == "--"
    for line, (init, design) in zip(lines, [("random", "none"), ("copy_all", "none"), ("distilled", "kl"),
                                            ("distilled", "mse")]):
        means = [(accuracy(init, design, b, 0) + accuracy(init, design, b, 1)) / 2 for b in BUDGETS]
        assert np.allclose(line.get_ydata(), means)
    # Wall-clock: train seconds (budget/10 + seed: mean budget/10 + 0.5) plus the distillation's seconds.
    lines = mean_lines(seconds_ax)
    assert np.allclose(lines[0].get_xdata(), [b / 10 + 0.5 for b in BUDGETS])
    assert np.allclose(lines[2].get_xdata(), [b / 10 + 0.5 + DISTILL_TIME for b in BUDGETS])
    # Bars: the claims' 95% t interval over the two seeds at each budget.
    segments = [s for c in steps_ax.collections for s in c.get_segments()]
    low, high = t_interval([accuracy("random", "none", 100, s) for s in (0, 1)])
    assert any(np.allclose(s, [[100, low], [100, high]], atol=1e-6) for s in segments)
    assert "softmax reference" in legend_labels(fig) and "95% t interval over seeds" in legend_labels(fig)


def test_cost_to_accuracy_one_budget_goes_along_training(tmp_path, captured):
    """One budget gives one point per line through budgets; with the curves, each line runs through the
    runs' evaluations instead, shifted by the distillation's steps and seconds."""
    runs = cost_runs()
    runs = runs[runs["budget"] == 400]
    curves = curves_frame(runs)
    figures.cost_to_accuracy(runs, CONFIG, tmp_path, curves)
    fig = captured["cost_to_accuracy"]
    steps_ax, seconds_ax = panel(fig, "dsA · linA · micro")
    assert fig.subfigs[0]._suptitle.get_text().startswith("Test accuracy along training")
    lines = [line for line in steps_ax.get_lines() if line.get_marker() == "o"]
    along = [0, 100, 200, 300, 400]
    assert [list(line.get_xdata()) for line in lines] == [along, along, [s + DISTILL_STEPS for s in along],
                                                          [s + DISTILL_STEPS for s in along], along]
    for line, (init, design) in zip(lines, [("random", "none"), ("copy_all", "none"), ("distilled", "kl")]):
        final = (accuracy(init, design, 400, 0) + accuracy(init, design, 400, 1)) / 2
        assert np.allclose(line.get_ydata(), [final * (k + 1) / 5 for k in range(5)])
    # Wall-clock: each evaluation's elapsed_s (k) plus the distillation's seconds.
    seconds = [line for line in seconds_ax.get_lines() if line.get_marker() == "o"]
    assert np.allclose(seconds[0].get_xdata(), range(5)) and np.allclose(seconds[2].get_xdata(),
                                                                         [k + DISTILL_TIME for k in range(5)])
    # Several budgets keep the points through budgets, curves or not.
    figures.cost_to_accuracy(cost_runs(), CONFIG, tmp_path / "b", curves_frame(cost_runs()))
    assert captured["cost_to_accuracy"].subfigs[0]._suptitle.get_text().startswith("Test accuracy against steps")


def test_accuracy_vs_throughput_one_marker_per_operator_and_init(tmp_path, captured):
    runs = cost_runs()
    check_files(figures.accuracy_vs_throughput(runs, CONFIG, tmp_path), "accuracy_vs_throughput", min_px=(400, 600))
    fig = captured["accuracy_vs_throughput"]
    assert fig._suptitle.get_text().startswith("Accuracy against throughput at the largest budget: 1600 steps")
    ax = panel(fig, "dsA · micro")[0]
    points = {(line.get_marker(), float(line.get_xdata()[0])): float(line.get_ydata()[0])
              for line in ax.get_lines() if line.get_marker() in ("o", "s", "*")}
    # Operators by marker (linA o, linB s) at their mean throughput (+ 10 x seed: mean + 5); the reference a star.
    assert points[("*", 505.0)] == pytest.approx(0.805 + 1600 / 100000)
    for marker, variant in (("o", "linA"), ("s", "linB")):
        assert points[(marker, THROUGHPUT[variant] + 5)] == pytest.approx(
            max(accuracy(i, d, 1600, 0.5) for i, ds in DESIGNS.items() for d in ds))
    assert len([line for line in ax.get_lines() if line.get_marker() in ("o", "s")]) == 2 * len(LABELS)
    assert ax.get_xscale() == "log"
    assert {"operator linA", "operator linB", "softmax reference", *LABELS} <= set(legend_labels(fig))
