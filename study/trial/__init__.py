"""One trial on one machine: train (`train`), evaluate at depth and record the rows (`execute`), store and read the
weights again (`weights`), what a Tune trial is asked to do (`work`: a training and/or readings of trained weights),
the checks it makes first (`preflight`), how its process's malloc keeps freed memory (`heap`), the weights it
starts from (`start`: model.init_from) and a stored trial's model read back (`load`). `work` is torch-free: the
driver plans with it."""


def load_model(store, study: str, trial_id: str | None = None):
    """A stored trial's model in eval mode (study.trial.load.load_model)."""
    from study.trial.load import load_model as load

    return load(store, study, trial_id)
