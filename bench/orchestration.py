"""Benchmark: Ray Tune overhead. 40 trials of a 2-second trainable on the embedded Ray with 2 CPUs.

Uses the driver's own Ray start-up (study.run.session.init_ray) and run settings (local storage, FailureConfig,
actor reuse, the progress callback). Theoretical minimum = 40 x 2 s / 2 CPUs = 40 s; reports wall time
(Tuner.fit only, Ray already up) over that minimum. Target <= 1.25. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def two_second_trial(config: dict) -> None:
    from ray import tune

    t0 = time.perf_counter()
    time.sleep(config["seconds"])  # the trial's work: fixed duration, so only orchestration varies
    tune.report({"objective": config["i"], "work_s": time.perf_counter() - t0})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--no-reuse-actors", dest="reuse_actors", action="store_false",
                   help="a new worker process per trial (Tune's default; the driver reuses them)")
    args = p.parse_args()

    from ray import tune

    from study.run.progress import Progress
    from study.run.session import init_ray

    init_ray(None, num_cpus=args.cpus)
    with tempfile.TemporaryDirectory() as root:
        tuner = tune.Tuner(
            tune.with_resources(two_second_trial, {"cpu": 1}),
            param_space={"i": tune.grid_search(list(range(args.trials))), "seconds": args.seconds},
            tune_config=tune.TuneConfig(metric="objective", mode="max", reuse_actors=args.reuse_actors),
            run_config=tune.RunConfig(name="overhead", storage_path=root, verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=2),
                                      callbacks=[Progress("overhead", args.trials, "max")]),
        )
        t0 = time.perf_counter()
        grid = tuner.fit()
        wall = time.perf_counter() - t0
    assert len(grid) == args.trials and not any(r.error for r in grid)
    minimum = args.trials * args.seconds / args.cpus
    print(json.dumps({"bench": "orchestration", "trials": args.trials, "trial_seconds": args.seconds,
                      "cpus": args.cpus, "reuse_actors": args.reuse_actors, "wall_s": wall,
                      "theoretical_min_s": minimum, "overhead_ratio": wall / minimum, "target": 1.25}))


if __name__ == "__main__":
    main()
