"""The figures `loopstudy plot` draws, by name, each with what it shows: the one list of them. Kept apart from
study.analysis.figures (which draws them with matplotlib) so that the command line's parser reads it for free."""

FIGURE_KINDS: dict[str, str] = {
    "depth": "exact accuracy vs executed layers (log x), mean line and 95% CI band per setting, paper markers",
    "difficulty": "exact accuracy by difficulty at the deepest depth, per setting",
    "gamma": "InfiLoop step size gamma_t aligned to each puzzle's solving update (offset 0)",
    "score": "content score (median) against the number of wrong cells",
    "eff_layers": "effective layers against difficulty (halting)",
    "perturbation": "solved puzzles kept and relative distance after a perturbation, per eps",
    "overthinking": "exact accuracy vs depth as a multiple of training depth, with Deep Thinking's published curves",
    "checkpoints": "accuracy vs the training step of the weights read, a line per test-time depth, a panel per setting",
    "pareto": "accuracy vs test-time FLOPs per sample (log x), every reading with 95% CIs, the front as a line",
}
