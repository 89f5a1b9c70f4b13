"""Ablation tables from the results store (Polars lazy pipelines; no torch, no Ray).

Every table groups trials by the config columns that vary within the study (the sweep's axes; seed excluded) and
aggregates over seeds: mean, std, n and a 95% CI (Student t). `setting` names the group ("rule=infiloop
placement=both"); with paper=True the published rows join as setting "<method> [paper]", source "paper".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from study.analysis.published import paper_rows, study_task
from study.config import NON_IDENTITY, layers_per_step
from study.console import eprint
from study.errors import AnalysisError
from study.metrics import METRICS
from study.run.naming import float_labels
from study.spec.membership import KINDS, Membership, membership
from study.store import Store

# Config columns that never define a group: the seed, and the fields that cannot change a trial's results.
NOT_AXES = {"seed"} | {f"{section}.{name}" for section, name in NON_IDENTITY}


def t975(n: int) -> float:
    """Student's t quantile at 0.975 with n - 1 degrees of freedom, for a 95% CI over n seeds (scipy.special's
    inverse t CDF: scipy.stats.t.ppf's own function, without scipy.stats' extra half second of import)."""
    from scipy.special import stdtrit

    return float(stdtrit(n - 1, 0.975))


def ci95(std: float | None, n: int) -> float | None:
    if std is None or n < 2 or (isinstance(std, float) and math.isnan(std)):
        return None
    return t975(n) * std / math.sqrt(n)


def config_columns(trials: pl.DataFrame) -> list[str]:
    sections = ("task", "model", "train", "eval")
    return [c for c in trials.columns if c.split(".")[0] in sections or c in ("seed", "label")]


def varying_columns(trials: pl.DataFrame) -> list[str]:
    """The study's axes: config columns with more than one value across its trials (seed excluded). When the
    sweep names its variants (`label`), columns the label already determines are left out."""
    out = [c for c in config_columns(trials) if c not in NOT_AXES
           and trials.select(pl.col(c).cast(pl.String).n_unique()).item() > 1]
    if "label" not in out and "label" in trials.columns and (trials["label"].fill_null("") != "").any():
        out.insert(0, "label")  # one variant so far (a study still running): still say which
    if "label" in out:
        implied = [c for c in out if c != "label" and trials.group_by("label").agg(
            pl.col(c).cast(pl.String).n_unique().alias("k"))["k"].max() == 1]
        out = ["label", *[c for c in out if c not in implied and c != "label"]]
    return out


def short(col: str) -> str:
    return col.rsplit(".", 1)[-1]


def with_setting(trials: pl.DataFrame, axes: list[str], trained: pl.DataFrame | None = None) -> pl.DataFrame:
    """Add a `setting` label column from the axes' values.

    A reading of stored weights (`weights_of`) is named by its trained trial's setting plus the eval.* keys it
    changes: an eval.* value equal to the trained trial's (looked up in `trained`, default `trials`) stays out of
    the name, as does every eval.* value of a trial that trained its own weights. So `loopstudy evaluate` at other
    depths or precisions leaves the spec's own settings named as before."""
    if not axes:
        return trials.with_columns(pl.lit("all").alias("setting"))
    evals = [c for c in axes if c.startswith("eval.")] if "weights_of" in trials.columns else []
    frame = trials
    if evals:
        ref = (trained if trained is not None else trials).select(
            pl.col("trial_id").alias("weights_of"), *[pl.col(c).cast(pl.String).alias(f"__ref {c}") for c in evals])
        frame = trials.join(ref, on="weights_of", how="left", maintain_order="left")
    parts = []
    for c in axes:
        text = pl.col(c).cast(pl.String)
        if trials.schema[c].is_float():  # in the fewest digits that keep the study's values apart
            labels = float_labels(trials[c].drop_nulls().to_list())
            text = pl.lit(pl.Series([None if v is None else labels[v] for v in trials[c].to_list()], dtype=pl.String))
        part = text.fill_null("-") if c == "label" else pl.concat_str(pl.lit(f"{short(c)}="), text.fill_null("-"))
        if c in evals:  # named only where a reading changes it
            same = pl.col("weights_of").is_null() | pl.col(c).cast(pl.String).eq_missing(pl.col(f"__ref {c}"))
            part = pl.when(same).then(pl.lit(None, dtype=pl.String)).otherwise(part)
        parts.append(part)
    name = pl.concat_str(parts, separator=" ", ignore_nulls=True)
    named = frame.with_columns(pl.when(name == "").then(pl.lit("as trained")).otherwise(name).alias("setting"))
    return named.select(*trials.columns, "setting")


def aggregate(lf: pl.LazyFrame, by: list[str], values: list[str]) -> pl.DataFrame:
    """mean, std, n and 95% CI of each value column per group (n counts trials, i.e. seeds)."""
    aggs = []
    for v in values:
        aggs += [pl.col(v).mean().alias(f"{v}_mean"), pl.col(v).std().alias(f"{v}_std")]
    aggs.append(pl.len().alias("n"))
    df = lf.group_by(by).agg(aggs).sort(by).collect()
    order = list(by)
    for v in values:
        cis = [ci95(s, n) for s, n in zip(df[f"{v}_std"].to_list(), df["n"].to_list())]
        df = df.with_columns(pl.Series(f"{v}_ci95", cis, dtype=pl.Float64))
        order += [f"{v}_mean", f"{v}_ci95", f"{v}_std"]
    return df.select([*order, "n"]).with_columns(pl.lit("measured").alias("source"))


@dataclass
class Context:
    store: Store
    study: str
    trials: pl.DataFrame
    axes: list[str]
    skip_bad: bool = False
    include_stale: bool = False
    members: Membership | None = None  # the study's trials by kind, read once per context
    pooled: bool = False  # its depth rows hold pooled answers' pass@k (ARC): pass@2 is the headline (read once)
    # evaluations of weights kept along training (loopstudy evaluate --checkpoints), with their settings: only the
    # checkpoints table and figure read them (beside the final weights' trials, they would count a seed twice)
    checkpoints: pl.DataFrame | None = None

    @property
    def every_trial(self) -> pl.DataFrame:
        """Its trials and its readings of weights kept along training, in one frame."""
        if self.checkpoints is None or self.checkpoints.height == 0:
            return self.trials
        return pl.concat([self.trials, self.checkpoints], how="diagonal_relaxed")

    @property
    def value_axes(self) -> list[str]:
        """The axes worth their own column: a variant's name is already the setting."""
        return [a for a in self.axes if a != "label"]

    def table(self, name: str) -> pl.LazyFrame:
        meta = self.trials.select(["trial_id", "setting", *self.axes]).lazy()
        return self.store.scan(name, self.study, self.skip_bad).join(meta, on="trial_id", how="inner")

    @property
    def accuracy(self) -> list[str]:
        """The accuracy columns its tables show: exact and cell accuracy, after ARC's pass@k (per puzzle, per test
        input)."""
        pooled = ["puzzle_pass_at_2", "pass_at_2", "pass_at_1"] if self.pooled else []
        return [*pooled, "exact_acc", "cell_acc"]

    @property
    def headline(self) -> tuple[str, str]:
        """(column, axis label) of the accuracy the figures draw."""
        return ("puzzle_pass_at_2", "pass@2 (per puzzle)") if self.pooled else ("exact_acc", "exact accuracy")


def load_context(store: Store, study: str, skip_bad: bool = False, include_stale: bool = False) -> Context:
    """The study's complete member trials (study.spec.membership) with their setting labels; include_stale: the
    complete trials of earlier versions of its spec too. Says on stderr how many were left out."""
    studies = store.studies()
    if study not in studies:
        raise AnalysisError(f"no study {study!r} in {store.uri}; studies there: {', '.join(studies) or 'none'}")
    df = store.scan("trials", study, skip_bad).filter(pl.col("status") == "complete").collect()
    members = membership(store, study)
    stale = members.stale
    n_stale = df.filter(pl.col("trial_id").is_in(sorted(stale))).height
    if n_stale and not include_stale:
        df = df.filter(~pl.col("trial_id").is_in(sorted(stale)))
        eprint(f"loopstudy: {study}: {n_stale} complete trial(s) of an earlier version of its spec left out "
               "(--all, or include_stale=True, includes them)")
    along = reads_along_training()
    kept, df = df.filter(along), df.filter(~along)
    if df.height == 0:
        raise AnalysisError(f"study {study!r} has no completed trials yet in {store.uri} "
                            "(run `loopstudy status` to see what is pending)")
    axes = varying_columns(df)
    ctx = Context(store, study, with_setting(df, axes), axes, skip_bad, include_stale, members,
                  checkpoints=with_setting(kept, axes, trained=df))
    pooled = ctx.table("depth_eval").select(pl.col("puzzle_pass_at_2").is_not_null().any()).collect().item()
    return dataclasses.replace(ctx, pooled=bool(pooled))


def reads_along_training() -> pl.Expr:
    """Per trials row: an evaluation of weights kept before training ended (study.run.plan)."""
    return (pl.col("weights_of").is_not_null() & (pl.col("weights_step") < pl.col("train.steps"))).fill_null(False)


def overall(lf: pl.LazyFrame) -> pl.LazyFrame:
    return lf.filter(pl.col("difficulty").is_null())


def deepest(lf: pl.LazyFrame) -> pl.LazyFrame:
    """Each trial's reading at its deepest evaluated depth."""
    return lf.filter(pl.col("depth_layers") == pl.col("depth_layers").max().over("trial_id"))


# -- the tables --------------------------------------------------------------------------------------------------------
def training_depth() -> pl.Expr:
    """Executed layers of a trial's deepest training rollout: H steps per update, n_sup updates carried on, each
    step config.layers_per_step layers."""
    per_step = pl.struct("model.kind", "model.L", "model.n_layers").map_elements(
        lambda r: layers_per_step(r["model.kind"], r["model.L"], r["model.n_layers"]), return_dtype=pl.Int64)
    return pl.col("model.H") * pl.col("train.n_sup") * per_step


def with_depth_multiple(ctx: Context, lf: pl.LazyFrame) -> pl.LazyFrame:
    """Adds `depth_x`: a reading's depth as a multiple of its trial's training depth."""
    train = ctx.trials.select("trial_id", training_depth().alias("train_layers")).lazy()
    return lf.join(train, on="trial_id").with_columns(
        (pl.col("depth_layers") / pl.col("train_layers")).round(3).alias("depth_x"))


def t_depth(ctx: Context) -> pl.DataFrame:
    """Accuracy by executed layers, per setting (the depth-scaling table)."""
    return aggregate(overall(ctx.table("depth_eval")), ["setting", "depth_layers"], ctx.accuracy)


def t_final(ctx: Context) -> pl.DataFrame:
    """Accuracy at the deepest depth per setting: the generic ablation table (placement, beta, a1/a2, ...)."""
    return aggregate(deepest(overall(ctx.table("depth_eval"))), ["setting", *ctx.value_axes, "depth_layers"],
                     ctx.accuracy)


def t_halting(ctx: Context) -> pl.DataFrame:
    """Accuracy and effective layers at the deepest depth (tau / gamma / patience / eta0 sweeps)."""
    return aggregate(deepest(overall(ctx.table("depth_eval"))), ["setting", *ctx.value_axes],
                     ["exact_acc", "eff_layers", "halted_frac"])


def t_difficulty(ctx: Context) -> pl.DataFrame:
    """Accuracy by difficulty (blanks) at the deepest depth, and the effective layers where trials halt."""
    lf = deepest(ctx.table("depth_eval")).filter(pl.col("difficulty").is_not_null())
    return aggregate(lf, ["setting", "difficulty"], [ctx.headline[0],
                                                     *(["eff_layers"] if halting_evaluated(ctx) else [])])


def t_overthinking(ctx: Context) -> pl.DataFrame:
    """Accuracy against test-time depth as a multiple of training depth (depth_x), per setting and test
    difficulty (a prefix-sum length, a maze side; null: all): overthinking is accuracy falling as depth_x grows."""
    lf = with_depth_multiple(ctx, ctx.table("depth_eval"))
    return aggregate(lf, ["setting", "difficulty", "depth_x"], [ctx.headline[0]])


def t_retention(ctx: Context) -> pl.DataFrame:
    """Overthinking in four numbers per setting, each first per trial (so the CIs are over seeds): the peak
    accuracy over depths, the accuracy at 10x the training depth (null without a reading at exactly 10x), their
    ratio (retained_10x; <= 0.5 is losing at least half the peak; undefined for a trial that never solved
    anything) and the accuracy at the deepest reading (deepest_x times the training depth)."""
    return aggregate(retention_per_trial(ctx), ["setting", "deepest_x"], ["peak", "at_10x", "retained_10x", "deepest"])


def retention_per_trial(ctx: Context) -> pl.LazyFrame:
    """Per trial: peak, at_10x, retained_10x, deepest and deepest_x (t_retention's numbers before the mean)."""
    lf = with_depth_multiple(ctx, overall(ctx.table("depth_eval")))
    acc = pl.col(ctx.headline[0])
    return lf.group_by("trial_id", "setting").agg(
        acc.max().alias("peak"), acc.filter(pl.col("depth_x") == 10).first().alias("at_10x"),
        acc.sort_by("depth_layers").last().alias("deepest"), pl.col("depth_x").max().alias("deepest_x"),
    ).with_columns(pl.when(pl.col("peak") > 0).then(pl.col("at_10x") / pl.col("peak")).alias("retained_10x"))


def t_stability(ctx: Context) -> pl.DataFrame:
    """Stability between two updates: predictions changed, wrong-cell delta, flipped cells, solved-then-lost."""
    lf = ctx.table("dynamics").filter(pl.col("kind") == "stability")
    return aggregate(lf, ["setting", "from_update", "update"], ["changed", "wrong_delta", "flipped", "lost"])


def t_perturbation(ctx: Context) -> pl.DataFrame:
    """Solved puzzles kept and relative distance, at the last update after the perturbation, per eps."""
    lf = ctx.table("perturbation")
    lf = lf.filter(pl.col("updates_after") == pl.col("updates_after").max().over("trial_id"))
    return aggregate(lf, ["setting", "eps", "updates_after"], ["solved_kept", "rel_distance"])


def checkpoint_readings(ctx: Context) -> pl.LazyFrame:
    """Depth rows of every setting read along training: each checkpoint's readings and the final weights' (its
    trial, or its evaluation with the same eval section), with `train_step`, the training step of the weights."""
    settings = ctx.checkpoints["setting"].unique().to_list() if ctx.checkpoints is not None else []
    final = ctx.trials.filter(pl.col("setting").is_in(settings))
    meta = pl.concat([final, ctx.checkpoints], how="diagonal_relaxed").select(
        "trial_id", "setting", pl.col("weights_step").alias("train_step"))
    return ctx.store.scan("depth_eval", ctx.study, ctx.skip_bad).join(meta.lazy(), on="trial_id", how="inner")


def t_checkpoints(ctx: Context) -> pl.DataFrame:
    """Accuracy against the training step of the weights read, at each test-time depth (loopstudy evaluate
    --checkpoints): whether an earlier checkpoint reads better than the final one, and where."""
    return aggregate(overall(checkpoint_readings(ctx)), ["setting", "depth_layers", "train_step"], ctx.accuracy)


def t_optuna(ctx: Context) -> pl.DataFrame:
    """One row per trial of the study, complete or not (a search's history: trials ASHA stopped keep the step they
    reached and their last objective), complete ones first, best first; stale trials only with include_stale."""
    states = ctx.members.status
    keep = sorted(t for t, s in states.items() if s != "pending" and (s != "stale" or ctx.include_stale))
    df = ctx.store.scan("trials", ctx.study, ctx.skip_bad).filter(pl.col("trial_id").is_in(keep)).collect()
    knobs = [c for c in varying_columns(df) if c != "label"]
    cols = ["trial_id", "status", "step", "objective", *[m for m in METRICS if df[m].is_not_null().any()], *knobs]
    search = ctx.members.search if ctx.members else None
    if search is not None and search.multi:  # which complete (and feasible) trials make the search's front
        from study.analysis.front import search_front

        df, cols = search_front(df, search), [*cols, "pareto"]
    # complete trials first (objective: the study's first metric), then the rest (objective: the last training signal)
    return df.select(cols).sort([pl.col("status") != "complete", pl.col("objective")], descending=[False, True],
                                nulls_last=True)


TABLES: dict[str, tuple[Callable[[Context], pl.DataFrame], str | None]] = {
    "depth": (t_depth, "depth"),
    "final": (t_final, "main"),
    "placement": (t_final, "placement"),
    "beta": (t_final, "beta"),
    "scaling": (t_final, "scaling"),
    "halting": (t_halting, "halting"),
    "difficulty": (t_difficulty, "difficulty"),
    "overthinking": (t_overthinking, "overthinking"),
    "retention": (t_retention, None),
    "checkpoints": (t_checkpoints, None),
    "stability": (t_stability, "stability"),
    "perturbation": (t_perturbation, "perturbation"),
    "optuna": (t_optuna, None),
}


def build_table(store: Store, study: str, kind: str, paper: bool = False, skip_bad: bool = False,
                include_stale: bool = False, ctx: Context | None = None) -> pl.DataFrame:
    """Table `kind` of the study (ctx: a loaded context to reuse, as the report does for every table)."""
    if kind not in TABLES:
        raise AnalysisError(f"unknown table {kind!r}; tables: {', '.join(TABLES)}")
    ctx = ctx or load_context(store, study, skip_bad, include_stale)
    why = applies(kind, ctx)
    if why:
        raise AnalysisError(f"table {kind} does not apply to study {study!r}: {why}")
    fn, _ = TABLES[kind]
    df = fn(ctx)
    if df.height == 0:
        raise AnalysisError(f"study {study!r} has no rows for table {kind!r} (was it evaluated with the "
                            "matching eval options, e.g. eval.stability or eval.perturb_update?)")
    if paper:
        df = pl.concat([df, paper_rows(kind, TABLES[kind][1], df, study_task(ctx.trials))],
                       how="vertical_relaxed")
    return df


def _varies(ctx: Context, *cols: str) -> bool:
    return any(c in ctx.trials.columns and ctx.trials[c].cast(pl.String).n_unique() > 1 for c in cols)


def halts(ctx: Context) -> pl.Expr:
    """Per trial: whether it halted samples at test time (eval.halting, else model.halting.enabled)."""
    on = pl.col("model.halting.enabled").fill_null(False)
    if "eval.halting" in ctx.trials.columns:
        on = pl.when(pl.col("eval.halting").is_not_null()).then(pl.col("eval.halting")).otherwise(on)
    return on


def halting_evaluated(ctx: Context) -> bool:
    """Whether any trial of the study halted samples at test time."""
    return bool(ctx.trials.select(halts(ctx).any()).item())


def reads_past_training(ctx: Context) -> bool:
    """Whether the study reads any trial deeper than it was trained."""
    x = with_depth_multiple(ctx, ctx.table("depth_eval")).select(pl.col("depth_x").max()).collect().item()
    return x is not None and x > 1


def applies(kind: str, ctx: Context) -> str | None:
    """None when table `kind` has something to show for this study, else why not (a table of a knob the study
    does not sweep would only repeat the final table beside unrelated published rows)."""
    if kind == "placement" and not _varies(ctx, "model.carry.placement"):
        return "the study does not sweep model.carry.placement"
    if kind == "beta" and not _varies(ctx, "model.carry.beta_init"):
        return "the study does not sweep model.carry.beta_init"
    scaled = dataclasses.replace(ctx, trials=ctx.trials.filter(pl.col("model.residual_scaling").fill_null(False)))
    if kind == "scaling" and not _varies(scaled, "model.a1_init", "model.a2_init"):
        return "the study does not sweep FPRM's tied scaling (model.a1_init / a2_init with residual_scaling on)"
    if kind == "optuna" and ctx.members.optuna_samples is None:
        return "not an Optuna search (every trial of a grid study is in the other tables)"
    if kind == "halting" and not halting_evaluated(ctx):
        return "no trial halts at test time (model.halting.enabled / eval.halting)"
    if kind == "checkpoints" and (ctx.checkpoints is None or ctx.checkpoints.height == 0):
        return "no evaluation of weights kept along training (train.keep_checkpoints, then loopstudy evaluate " \
               "STUDY --checkpoints)"
    if kind in ("overthinking", "retention") and not reads_past_training(ctx):
        return "no reading is deeper than the trial's training depth"
    return None


def list_studies(store: Store) -> pl.DataFrame:
    """Studies with their trials by kind (study.spec.membership: complete, stopped, running, failed, pending, stale)
    and whether they are compacted; the same counts as `loopstudy status`."""
    rows = []
    for s in store.studies():
        counts = membership(store, s).counts()
        rows.append({"study": s, **{k: counts[k] for k in KINDS}, "compacted": store.is_compacted(s)})
    return pl.DataFrame(rows) if rows else pl.DataFrame({"study": []})
