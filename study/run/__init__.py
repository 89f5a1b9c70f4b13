"""Everything that talks to Ray: start-up (`session`), the Tuner (`tuner`), the one driver behind run / resume /
evaluate (`driver`), what it plans to run (`plan`), the checks before any trial (`preflight`), the Tune trial
function (`trainable`), the Optuna searcher and storage (`search`, `optuna_storage`), progress lines (`progress`),
live trackers (`tracking`) and Ray Jobs (`submit`). Importing this package starts nothing; Ray and torch are
imported when a driver starts."""
