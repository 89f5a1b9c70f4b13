"""Live tracking through Ray Tune's own logger callbacks: TensorBoard (tensorboardX), MLflow and Weights & Biases.

Each trial is one run, named `<setting>-s<seed>-<trial id>` (TrialParams: the setting is a variant's name, the
grid values or an Optuna sample's picks); its params are the trial's flat config (the dotted columns of the `trials`
table), not Tune's config, which carries the config as JSON text. The x axis is the training step (`step` in
every report; checkpoint and evaluation reports repeat it): train loss, cell and exact accuracy and the learning
rate arrive live at every train.log_every; the final metrics and the accuracy at each test-time depth
(`depth/exact_acc/<layers>`) come with the last report, and TensorBoard and MLflow also get the depth curve as
`depth_curve/exact_acc` with executed layers as its step.

Where runs go (study.spec.schema.TrackingSpec): TensorBoard event files in each trial's Tune folder (`tensorboard
--logdir <root>/_tune/<study>`); MLflow to `tracking.mlflow` when it is a tracking URI, else an SQLite store
`<tracking dir>/mlflow.db` (`mlflow ui --backend-store-uri sqlite:///...`); W&B offline into `<tracking dir>/wandb`
(`wandb sync` uploads it later), or online with `tracking.wandb: online` and WANDB_API_KEY. The tracking dir is
`<root>/_tracking/<study>` for a local root, this machine's cache for an object-store one (layout.tracking_dir).
Imports Ray: the driver imports this module only when it builds a Tuner with tracking on (study.run.tuner).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.tune.logger import TBXLoggerCallback

from study.config import to_dict, trial_id
from study.metrics import DEPTH_KEY
from study.run.naming import picks, setting
from study.store import config_row

STEP = "step"  # the training step, in every report (study/run/trainable.py)


def depth_curve(result: dict[str, Any] | None) -> list[tuple[int, float]]:
    """(executed layers, exact accuracy) from a final report, in depth order."""
    return sorted((int(k[len(DEPTH_KEY):]), v) for k, v in (result or {}).items() if k.startswith(DEPTH_KEY))


def tracked(result: dict[str, Any]) -> dict[str, Any] | None:
    """What a tracker logs of a report: a training log or the last report, at the training step (Tune's loggers
    take `timesteps_total` when a result has it, else Tune's report count), without Tune's config (the run's
    params hold it). None for checkpoint and evaluation-progress reports, which would only repeat a step."""
    if result.get("phase") != "train" and not result.get("final"):
        return None
    return {**{k: v for k, v in result.items() if k != "config"}, "timesteps_total": result.get(STEP)}


class TrialParams:
    """A trial's run name and flat config, from the config Tune hands it (cached per Tune trial)."""

    def __init__(self, swept: list[str]):
        self.swept = swept  # the dotted keys that name a grid point (study.run.naming.swept_keys)
        self._cache: dict[str, tuple[str, dict[str, Any]]] = {}

    def _resolve(self, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        from study.run.trainable import trial_config

        key = json.dumps(config.get("trial"), sort_keys=True) + json.dumps(config.get("searched"), sort_keys=True,
                                                                           default=str)
        if key not in self._cache:
            cfg = trial_config(config)
            flat = config_row(to_dict(cfg))
            what = picks(config["searched"]) if config.get("searched") else setting(flat, self.swept)
            self._cache[key] = (f"{what or 'trial'}-s{cfg.seed}-{trial_id(cfg)}", flat)
        return self._cache[key]

    def name(self, trial) -> str:
        """Tune's trial_name_creator: `<setting>-s<seed>-<trial id>`."""
        return self._resolve(trial.config)[0]

    def dirname(self, trial) -> str:
        """Tune's trial_dirname_creator: the run name, safe as a folder name."""
        return "".join(c if c.isalnum() or c in "-_.=," else "_" for c in self.name(trial))[:120]

    def params(self, trial) -> dict[str, Any]:
        """The trial's flat config (dotted keys), as its run's params."""
        return self._resolve(trial.config)[1]


class TensorBoard(TBXLoggerCallback):
    """Tune's TensorBoard logger at the training step, with the flat config as hparams and the depth curve. Uses
    ray 2.60's per-trial writers and hparams hook (private; Ray is pinned in pyproject.toml)."""

    def __init__(self, params: TrialParams):
        super().__init__()
        self._params = params

    def log_trial_result(self, iteration: int, trial, result: dict) -> None:
        if (kept := tracked(result)) is not None:
            super().log_trial_result(iteration, trial, kept)

    def log_trial_end(self, trial, failed: bool = False) -> None:
        writer = self._trial_writer.get(trial)
        if writer is not None:
            for layers, acc in depth_curve(trial.last_result):
                writer.add_scalar("depth_curve/exact_acc", acc, global_step=layers)
        super().log_trial_end(trial, failed)

    # Tune's own hparams are its config, here JSON text: the flat config instead
    def _try_log_hparams(self, trial, result: dict) -> None:
        from tensorboardX.summary import hparams

        flat = {k: v for k, v in self._params.params(trial).items() if isinstance(v, bool | int | float | str)}
        for tag in hparams(hparam_dict=flat, metric_dict=result):
            self._trial_writer[trial].file_writer.add_summary(tag)


class MLflow(MLflowLoggerCallback):
    """Tune's MLflow logger at the training step, with the flat config as params and the depth curve. Uses ray
    2.60's map of trials to MLflow runs (private; Ray is pinned in pyproject.toml)."""

    def __init__(self, params: TrialParams, **kwargs):
        super().__init__(**kwargs)
        self._params = params

    def log_trial_start(self, trial) -> None:
        if trial not in self._trial_runs:
            run = self.mlflow_util.start_run(tags={**self.tags, "trial_name": str(trial)}, run_name=str(trial))
            self._trial_runs[trial] = run.info.run_id
            self.mlflow_util.log_params(run_id=run.info.run_id, params_to_log=self._params.params(trial))

    def log_trial_result(self, iteration: int, trial, result: dict) -> None:
        if (kept := tracked(result)) is not None:
            super().log_trial_result(iteration, trial, kept)

    def log_trial_end(self, trial, failed: bool = False) -> None:
        run_id = self._trial_runs[trial]
        for layers, acc in depth_curve(trial.last_result):
            self.mlflow_util.log_metrics(run_id=run_id, metrics_to_log={"depth_curve/exact_acc": acc}, step=layers)
        self.mlflow_util.end_run(run_id=run_id, status="FAILED" if failed else "FINISHED")


def wandb_callback(params: TrialParams, *, project: str, mode: str, folder: Path):
    """Tune's W&B logger: one run per trial, the flat config, offline (default) or online, at the training step."""
    # ray 2.60's private W&B actor and its hook (pinned in pyproject.toml): the public callback has no way to log at
    # the training step instead of Tune's report count
    from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

    class AtStep(_WandbLoggingActor):
        def _handle_result(self, result: dict) -> tuple[dict, dict]:
            log, _ = super()._handle_result(result)
            # Tune's actor logs at `training_iteration`; W&B's step is then the training step
            log["training_iteration"] = result[STEP]
            return log, {}

        def run(self):
            super().run()
            # finish() returns before W&B's service has written the run file, and Ray ends this actor's child
            # processes with it: wait for the service while Tune still waits on this call (seen in CI: a run file
            # with its header only, the service killed before "stream: all finished")
            self._wandb.teardown()

    class WandB(WandbLoggerCallback):
        _logger_actor_cls = AtStep

        def setup(self, *args, **kwargs) -> None:
            if self.kwargs.get("mode") != "offline":  # offline runs need no account, so no API key
                super().setup(*args, **kwargs)

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            if (kept := tracked(result)) is not None:
                super().log_trial_result(iteration, trial, kept)

        def log_trial_start(self, trial) -> None:
            # W&B's config is the flat config (Tune's holds the config as JSON text)
            original, trial.config = trial.config, {**self._params.params(trial)}
            try:
                super().log_trial_start(trial)
            finally:
                trial.config = original

    folder.mkdir(parents=True, exist_ok=True)
    cb = WandB(project=project, mode=mode, dir=str(folder), log_config=False,
               excludes=["node", "phase", "progress", "trial", "timesteps_total"])
    cb._params = params
    return cb


def callbacks(tracking, *, study: str, folder: Path, swept: list[str]) -> tuple[list, TrialParams]:
    """The logger callbacks the spec's `tracking` section asks for, and the names/params they share."""
    params = TrialParams(swept)
    project = tracking.project or study
    out: list = []
    if tracking.tensorboard:
        out.append(TensorBoard(params))
    if tracking.mlflow:
        uri = tracking.mlflow if isinstance(tracking.mlflow, str) else mlflow_default(folder)
        out.append(MLflow(params, tracking_uri=uri, experiment_name=project))
    if tracking.wandb:
        mode = tracking.wandb if isinstance(tracking.wandb, str) else "offline"
        out.append(wandb_callback(params, project=project, mode=mode, folder=folder))
    return out, params


def mlflow_default(folder: Path) -> str:
    """MLflow's default store here: SQLite in the tracking folder (MLflow 3 keeps its file store for reading)."""
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder.resolve()}/mlflow.db"

