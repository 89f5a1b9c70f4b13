"""Comparisons paired by seed (study.analysis.compare) on a hand-made study: numbers checked by hand and by scipy."""

import math
import subprocess
import sys
from datetime import UTC, datetime

import numpy as np
import pytest
from scipy import stats

from study.analysis.compare import Comparison, compare, holm, seeds_for
from study.analysis.tables import load_context, t975
from study.config import TrialConfig, to_dict
from study.errors import AnalysisError
from study.store import Store, config_row

from .conftest import REPO

TRAIN_LAYERS = 3 * 4 * 14  # H x n_sup x (L + 1) n_layers of the default config: the training depth, 168
PEAK, TEN_X = TRAIN_LAYERS, 10 * TRAIN_LAYERS
# exact accuracy at the training depth and at 10x it, per rule and seed; infiloop has no seed 4 (unpaired)
ACC = {
    "carry_last": {0: (0.80, 0.10), 1: (0.70, 0.20), 2: (0.90, 0.05), 3: (0.60, 0.30), 4: (0.75, 0.15)},
    "infiloop": {0: (0.85, 0.70), 1: (0.80, 0.60), 2: (0.90, 0.85), 3: (0.70, 0.50)},
    "damped": {0: (0.82, 0.12), 1: (0.71, 0.25), 2: (0.88, 0.02), 3: (0.62, 0.33), 4: (0.74, 0.18)},
}
BASE = "rule=carry_last"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("paired"))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for rule, seeds in ACC.items():
        for seed, accs in seeds.items():
            cfg = to_dict(TrialConfig(seed=seed))
            cfg["model"]["carry"]["rule"] = rule
            tid = f"{rule[:3]}{seed}"
            store.write("depth_eval", "paired", tid, [
                {"depth_layers": d, "outer_cycles": d // 14, "difficulty": None, "n": 100, "exact_acc": a,
                 "cell_acc": 0.9, "halted_frac": 0.0, "eff_layers": float(d)} for d, a in zip((PEAK, TEN_X), accs)])
            for table in ("dynamics", "perturbation", "train_curve"):
                store.write(table, "paired", tid, [])
            store.write("trials", "paired", tid, [{**config_row(cfg), "status": "complete", "params": 1,
                                                   "started": now, "ended": now, "wall_s": 1.0, "device": "cpu",
                                                   "final_exact_acc": accs[1]}])
    return load_context(store, "paired")


def by_hand(rule, pick):
    seeds = sorted(ACC[rule].keys() & ACC["carry_last"].keys())
    return np.array([pick(ACC[rule][s]) - pick(ACC["carry_last"][s]) for s in seeds])


def test_the_paired_difference_its_ci_and_p_value_are_the_hand_computed_ones(ctx):
    df = compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X))
    assert df["setting"].to_list() == ["rule=damped", "rule=infiloop"]  # by name
    for rule in ("infiloop", "damped"):
        d = by_hand(rule, lambda a: a[1])
        row = df.filter(df["setting"] == f"rule={rule}").row(0, named=True)
        half = t975(len(d)) * d.std(ddof=1) / math.sqrt(len(d))
        assert row["n_pairs"] == len(d) and row["diff"] == pytest.approx(d.mean())
        assert (row["ci95_lo"], row["ci95_hi"]) == pytest.approx((d.mean() - half, d.mean() + half))
        assert row["p"] == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
        assert row["metric"] == f"exact_acc@{TEN_X}" and row["baseline"] == BASE
    # infiloop keeps far more at 10x (decided); damped does not differ (its CI spans 0)
    inf, dmp = (df.filter(df["setting"] == s).row(0, named=True) for s in ("rule=infiloop", "rule=damped"))
    assert inf["ci95_lo"] > 0 and dmp["ci95_lo"] < 0 < dmp["ci95_hi"]


def test_an_unpaired_seed_is_named_and_left_out(ctx, capsys):
    df = compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X))
    row = df.filter(df["setting"] == "rule=infiloop").row(0, named=True)
    assert row["n_pairs"] == 4 and row["unpaired_seeds"] == "4"
    assert "seed(s) 4 unpaired" in capsys.readouterr().err


def test_p_values_are_holm_corrected_across_the_settings_compared(ctx):
    df = compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X))
    assert df["p_holm"].to_list() == pytest.approx(holm(df["p"].to_list()))
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3p, then max(2p, prev), then max(p, prev)
    assert holm([0.5, None]) == [0.5, None]


def test_settings_chosen_alone_form_the_holm_family(ctx):
    one = compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X, settings=("rule=infiloop",)))
    every = compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X))
    assert one["setting"].to_list() == ["rule=infiloop"]
    mine = every.filter(every["setting"] == "rule=infiloop")
    assert one["p"].item() == pytest.approx(mine["p"].item())
    assert one["diff"].item() == pytest.approx(mine["diff"].item())
    assert one["p_holm"].item() == pytest.approx(one["p"].item())  # a family of one: no correction
    assert mine["p_holm"].item() > mine["p"].item()
    with pytest.raises(AnalysisError, match="'rule=nope': not a setting of study 'paired'; its settings: rule=carr"):
        compare(ctx, Comparison(BASE, settings=("rule=nope",)))

def test_retention_is_compared_per_seed_with_a_seeded_bootstrap_ci(ctx):
    cmp = Comparison(BASE, retention=True)
    df = compare(ctx, cmp)
    d = by_hand("infiloop", lambda a: a[1] / a[0])
    row = df.filter(df["setting"] == "rule=infiloop").row(0, named=True)
    assert row["metric"] == "retained_10x" and row["diff"] == pytest.approx(d.mean())
    assert row["boot_lo"] < row["diff"] < row["boot_hi"] and d.min() <= row["boot_lo"]
    assert compare(ctx, cmp).equals(df)  # the same bootstrap every read


def test_a_trial_metric_is_compared_one_value_per_trial(ctx):
    df = compare(ctx, Comparison(BASE, "final_exact_acc"))
    row = df.filter(df["setting"] == "rule=infiloop").row(0, named=True)
    assert row["metric"] == "final_exact_acc"
    assert row["diff"] == pytest.approx(by_hand("infiloop", lambda a: a[1]).mean())


def test_power_gives_the_fewest_seeds_for_the_half_width(ctx):
    d = by_hand("damped", lambda a: a[1])
    sd = d.std(ddof=1)
    n = seeds_for(sd, 0.01)
    assert t975(n) * sd / math.sqrt(n) <= 0.01 < t975(n - 1) * sd / math.sqrt(n - 1)
    df = compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X, half_width=0.01))
    assert df.filter(df["setting"] == "rule=damped")["seeds_for_half_width"].item() == n
    with pytest.raises(AnalysisError, match="--half-width 0"):
        seeds_for(sd, 0)


def test_bad_input_says_what_exists(ctx):
    with pytest.raises(AnalysisError, match="not a setting of study 'paired'.*rule=carry_last"):
        compare(ctx, Comparison("rule=nope"))
    with pytest.raises(AnalysisError, match="unknown metric 'wat'"):
        compare(ctx, Comparison(BASE, "wat"))
    with pytest.raises(AnalysisError, match="no reading at 7 layers"):
        compare(ctx, Comparison(BASE, "exact_acc", depth=7))


def test_the_python_api_gives_the_same_table(ctx):
    from study.analysis.results import open_results

    api = open_results(ctx.store.uri).compare("paired", BASE, depth=TEN_X, half_width=0.05)
    assert api.equals(compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X, half_width=0.05)))
    one = open_results(ctx.store.uri).compare("paired", BASE, depth=TEN_X, settings=["rule=damped"])
    assert one.equals(compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X, settings=("rule=damped",))))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_table_compare_from_the_cli(ctx):
    root = ctx.store.uri
    proc = cli("table", "compare", "--study", "paired", "--store", root, "--baseline", BASE, "--depth", str(TEN_X),
               "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("setting,baseline,metric,n_pairs,baseline_mean,diff,ci95_lo")
    no_base = cli("table", "compare", "--study", "paired", "--store", root)
    assert no_base.returncode == 2 and "needs --baseline" in no_base.stderr
    other = cli("table", "depth", "--study", "paired", "--store", root, "--baseline", BASE)
    assert other.returncode == 2 and "--baseline: for `loopstudy table compare` only" in other.stderr
    chosen = cli("table", "compare", "--study", "paired", "--store", root, "--baseline", BASE, "--depth", str(TEN_X),
                 "--settings", "rule=damped", "--format", "csv")
    assert chosen.returncode == 0, chosen.stderr
    assert [line.split(",")[0] for line in chosen.stdout.splitlines()[1:]] == ["rule=damped"]


def test_a_depth_never_read_names_the_depths_that_were(ctx):
    with pytest.raises(AnalysisError, match=f"no reading at 7 layers; depths read: {PEAK}, {TEN_X}"):
        compare(ctx, Comparison(BASE, "exact_acc", depth=7))


def test_retention_without_a_reading_at_10x_says_which_depth_it_needs(tmp_path):
    store = Store(tmp_path)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for rule in ("carry_last", "infiloop"):
        for seed in (0, 1):
            cfg = to_dict(TrialConfig(seed=seed))
            cfg["model"]["carry"]["rule"] = rule
            tid = f"{rule[:3]}{seed}"
            store.write("depth_eval", "shallow", tid, [
                {"depth_layers": PEAK, "outer_cycles": PEAK // 14, "difficulty": None, "n": 100, "exact_acc": 0.5,
                 "cell_acc": 0.9, "halted_frac": 0.0, "eff_layers": float(PEAK)}])
            for table in ("dynamics", "perturbation", "train_curve"):
                store.write(table, "shallow", tid, [])
            store.write("trials", "shallow", tid, [{**config_row(cfg), "status": "complete", "params": 1,
                                                    "started": now, "ended": now, "wall_s": 1.0, "device": "cpu"}])
    proc = cli("table", "compare", "--study", "shallow", "--store", str(tmp_path), "--baseline", BASE,
               "--retention")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"retention needs a reading at 10x each trial's training depth ({TEN_X:,} layers" in proc.stderr
    assert "no trial of study 'shallow' was read there" in proc.stderr and "unpaired" not in proc.stderr


@pytest.mark.parametrize("args", [("compare", "--baseline", BASE, "--half-width", "nan"),
                                  ("compare", "--baseline", BASE, "--half-width", "inf"),
                                  ("compare", "--baseline", BASE, "--depth", "0"),
                                  ("pareto", "--budget", "nan"), ("pareto", "--budget=-inf"),
                                  ("pareto", "--budget", "0")])
def test_nan_infinite_or_non_positive_numbers_on_the_command_line_are_refused(ctx, args):
    proc = cli("table", *args, "--study", "paired", "--store", ctx.store.uri)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    option = next(a.split("=")[0] for a in args if a.startswith("--") and a != "--baseline")
    assert option in proc.stderr and "is not allowed" in proc.stderr, proc.stderr


def test_machine_readable_formats_carry_every_value_as_stored(ctx, tmp_path):
    import json

    import polars as pl

    exact = compare(ctx, Comparison(BASE, "exact_acc", depth=TEN_X, half_width=0.05))
    args = ("table", "compare", "--study", "paired", "--store", ctx.store.uri, "--baseline", BASE, "--depth",
            str(TEN_X), "--half-width", "0.05")
    as_csv = pl.read_csv(cli(*args, "--format", "csv").stdout.encode())
    as_json = pl.DataFrame(json.loads(cli(*args, "--format", "json").stdout))
    proc = cli(*args, "--out", str(tmp_path / "cmp.parquet"))
    assert proc.returncode == 0 and "written to" in proc.stderr and proc.stdout == "", proc.stderr
    as_parquet = pl.read_parquet(tmp_path / "cmp.parquet")
    assert as_parquet.equals(exact)
    for got in (as_csv, as_json):
        for col in ("diff", "ci95_lo", "p", "p_holm", "baseline_mean"):
            assert got[col].to_list() == pytest.approx(exact[col].to_list(), rel=1e-15, abs=0), col
    refused = cli(*args, "--out", str(tmp_path / "cmp.csv"))
    assert refused.returncode == 2 and "a .parquet file" in refused.stderr


def test_step_compares_the_weights_kept_at_that_training_step_paired_by_seed(tmp_path):
    """Checkpoint readings (loopstudy evaluate --checkpoints) are compared at one training step, not the final
    weights: the values are the step's, paired by the seed of the trial whose weights were read."""
    store = Store(tmp_path)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    final = {"carry_last": [0.9, 0.8, 0.7], "infiloop": [0.9, 0.8, 0.7]}  # no difference at the end
    early = {"carry_last": [0.50, 0.40, 0.30], "infiloop": [0.30, 0.25, 0.20]}  # at step 10: -0.2, -0.15, -0.1

    def write(tid, cfg, acc, **extra):
        store.write("depth_eval", "curves", tid, [{"depth_layers": PEAK, "outer_cycles": 12, "difficulty": None,
                                                   "n": 100, "exact_acc": acc, "cell_acc": 0.9, "halted_frac": 0.0,
                                                   "eff_layers": float(PEAK)}])
        for table in ("dynamics", "perturbation", "train_curve"):
            store.write(table, "curves", tid, [])
        store.write("trials", "curves", tid, [{**config_row(cfg), "status": "complete", "params": 1, "started": now,
                                               "ended": now, "wall_s": 1.0, "device": "cpu", **extra}])

    for rule in final:
        for seed in range(3):
            cfg = to_dict(TrialConfig(seed=seed))
            cfg["model"]["carry"]["rule"] = rule
            write(f"{rule[:3]}{seed}", cfg, final[rule][seed])
            write(f"{rule[:3]}{seed}s10", cfg, early[rule][seed], weights_of=f"{rule[:3]}{seed}", weights_step=10)
    ctx = load_context(store, "curves")
    at_end = compare(ctx, Comparison(BASE, "exact_acc", depth=PEAK))
    assert at_end["diff"].item() == pytest.approx(0.0)
    at_10 = compare(ctx, Comparison(BASE, "exact_acc", depth=PEAK, step=10))
    assert at_10["setting"].to_list() == ["rule=infiloop"] and at_10["n_pairs"].item() == 3
    assert at_10["diff"].item() == pytest.approx(-0.15) and at_10["metric"].item() == f"exact_acc@{PEAK}, step 10"
    assert at_10["p"].item() == pytest.approx(stats.ttest_1samp([-0.2, -0.15, -0.1], 0).pvalue)
    with pytest.raises(AnalysisError, match="--step 20: study 'curves' has no reading of weights kept at step 20; "
                                            "steps read: 10"):
        compare(ctx, Comparison(BASE, depth=PEAK, step=20))
    with pytest.raises(AnalysisError, match="--step reads the depth rows of checkpoint readings"):
        compare(ctx, Comparison(BASE, retention=True, step=10))
