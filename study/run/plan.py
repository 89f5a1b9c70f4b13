"""Train once, read many times: evaluations of stored weights. Torch-free and Ray-free (the driver plans with it).

An evaluation reads a trained trial's stored weights (study/trial/weights.py) under another eval section, and is stored
as a trial of its own: a trials row (`weights_of` = the trained trial, `weights_step`, `eval_id`), its depth_eval,
dynamics and perturbation rows, and an empty train_curve, so every reader (tables, figures, report, the Python API,
DuckDB) sees it as one more setting, named by the eval keys that differ. Its trial id is the one the trial would
have had with that eval section (config.reading_id), so a spec that lists it finds it complete; one that reads
weights kept along training (`--checkpoints`) has an id of its own per step.

The rules, stated once:
- an evaluation may change eval.* keys only: any other change trains different weights, so it is a new trial;
- configs of a study that differ in eval.* keys only train once (the first one pending, or a trial already complete
  with stored weights) and the others read those weights: `pending_work`;
- readings already stored are skipped, so an evaluation that a dead driver left half done resumes by running it
  again.
"""

from __future__ import annotations

from typing import Any

from study.config import TrialConfig, build_trial, eval_keys, training_id, trial_id
from study.errors import ConfigError
from study.trial.work import Reading, WorkItem, kept_steps


def check_eval_overrides(overrides: dict[str, Any]) -> None:
    """Refuse overrides that are not eval.* keys (they change what is trained, which makes a new trial) and eval
    keys that do not exist."""
    allowed = eval_keys()
    other = sorted(k for k in overrides if not k.startswith("eval."))
    if other:
        raise ConfigError(f"{', '.join(other)}: an evaluation changes eval.* keys only (it reads weights that are "
                          "already trained); a change to what is trained is a new trial: put it in a spec and "
                          "`loopstudy run` it")
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not an eval key; eval keys: "
                          f"{', '.join(k.split('.', 1)[1] for k in allowed)}")


def pending_work(trials: list[TrialConfig], done: set[str], rows: dict[str, dict[str, Any]]) -> list[WorkItem]:
    """The pending trials of a grid study as work: configs that differ in eval.* keys only share one training.
    rows: trial id -> trials row of the study's complete trials (their stored weights, if any). A group with a
    complete trial that stored weights reads them; otherwise its first pending config trains and the rest read
    what it trained."""
    groups: dict[str, list[TrialConfig]] = {}
    for cfg in trials:
        groups.setdefault(training_id(cfg), []).append(cfg)
    work = []
    for cfgs in groups.values():
        pending = [c for c in cfgs if trial_id(c) not in done]
        if not pending:
            continue
        stored = next((trial_id(c) for c in cfgs if trial_id(c) in done
                       and (rows.get(trial_id(c)) or {}).get("weights_sha256")), None)
        if stored is not None:
            work.append(WorkItem(None, stored, [Reading(c) for c in pending]))
        else:
            work.append(WorkItem(pending[0], None, [Reading(c) for c in pending[1:]]))
    return work


def apply_eval(row: dict[str, Any], overrides: dict[str, Any], source: str) -> TrialConfig:
    """A stored trial's config (from its trials row) with eval.* overrides applied, validated; ConfigError for an
    override that is not an eval.* key."""
    from study.config import set_dotted
    from study.store.schema import config_from_row

    check_eval_overrides(overrides)
    data = config_from_row(row)
    for k, v in overrides.items():
        set_dotted(data, k, v)
    return build_trial(data, source)


def plan_work(study, store, done: set[str]) -> list[WorkItem]:
    """A grid study's pending trials as Tune's work (pending_work), with the stored weights of its complete ones."""
    import polars as pl

    if all(trial_id(c) in done for c in study.trials):
        return []
    rows = (store.scan("trials", study.name, skip_bad=True).filter(pl.col("trial_id").is_in(sorted(done)))
            .select("trial_id", "weights_sha256").collect())
    return pending_work(study.trials, done, {r["trial_id"]: r for r in rows.iter_rows(named=True)})


def reads_line(work: list[WorkItem]) -> str:
    """What the work reads without training, for the driver's opening line ('' when nothing)."""
    reads = sum(len(w.readings) for w in work)
    trains = sum(w.train is not None for w in work)
    if not reads:
        return ""
    return (f": {trains} to train, {reads} evaluation(s) of weights trained once for configs that differ in eval.* "
            "keys only")


def plan_readings(store, study, overrides: dict[str, Any], trials: list[str] | None,
                  checkpoints: bool) -> tuple[dict[str, list[Reading]], int]:
    """({trained trial id: its pending readings}, readings already stored) for `loopstudy evaluate`. Refuses (one
    line each) trial ids that are not the study's trained trials, and a study or selection whose trials stored no
    weights (or, with checkpoints, kept none along training)."""
    import polars as pl

    from study.console import eprint
    from study.errors import StoreError
    from study.spec.membership import membership

    name = study.name
    if not overrides and not checkpoints:
        raise ConfigError("nothing to evaluate: give eval.* overrides (e.g. eval.depths=[16,64,256] "
                          "eval.readout=max_conf) and/or --checkpoints")
    members = membership(store, name).members
    rows = (store.scan("trials", name, skip_bad=True)
            .filter((pl.col("status") == "complete") & pl.col("weights_of").is_null()
                    & pl.col("trial_id").is_in(sorted(members))).collect())
    rows = {r["trial_id"]: r for r in rows.iter_rows(named=True)}
    if trials:
        unknown = [t for t in trials if t not in rows]
        if unknown:
            raise ConfigError(f"--trials {' '.join(unknown)}: not a complete trained trial of study {name} (its "
                              f"trained trials: {', '.join(sorted(rows)[:8])}{' ...' if len(rows) > 8 else ''})")
        rows = {t: rows[t] for t in trials}
    if not rows:
        raise ConfigError(f"study {name} has no complete trained trial to evaluate")
    stored = {t: r for t, r in rows.items() if r.get("weights_sha256")}
    if not stored:
        raise StoreError(f"study {name}: none of its {len(rows)} trained trial(s) stored weights (they ran before "
                         "loopstudy kept them): there is nothing to evaluate; run the study again under a new name "
                         "to train them with their weights kept")
    if len(stored) < len(rows):
        eprint(f"[{name}] {len(rows) - len(stored)} trial(s) stored no weights (they ran before loopstudy kept "
               "them): not evaluated")
    if checkpoints and not any(kept_steps(r) for r in stored.values()):
        raise ConfigError(f"--checkpoints: no trial of study {name} kept weights along training (set "
                          "train.keep_checkpoints with train.checkpoint_every in its spec)")
    done = store.completed_trials(name)
    out, skipped = {}, 0
    for tid, row in stored.items():
        cfg = apply_eval(row, overrides, f"trial {tid} of study {name}")
        steps = [None, *(sorted(kept_steps(row)) if checkpoints else [])]
        # the final weights are step None; a reading with the trial's own eval section is the trial itself
        readings = [r for r in (Reading(cfg, step) for step in steps if step != row["step"]) if r.tid != tid]
        out[tid] = [r for r in readings if r.tid not in done]
        skipped += len(readings) - len(out[tid])
    return out, skipped
