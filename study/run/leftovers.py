"""Placement groups that a driver's stopped data-parallel trials leave reserved on a cluster, released once its
Tune run has ended.

Ray 2.60, Train under Tune: when Tune stops a trial (ASHA, the search's end, Ctrl-C), the GCS kills the trial's
Train workers at once but its Train controller gracefully, and marks the controller dead before it has exited. A
placement group the controller reserves in that time is registered after its creator's death, so Ray never
removes it: its CPUs stay reserved after the driver is gone, and the next data-parallel trial waits for them for
ever. Seen in CI: a controller allowed to retry took its killed workers for a failed group and reserved one for a
new group, registered 0.1 s after the GCS destroyed it. study.run.workers lets no controller retry; this releases
whatever such a run still reserved.

When Tune's run has returned, no trial of this driver runs any more, so every placement group its job still holds
is a leftover. Released through Ray's state API (the dashboard's); an embedded Ray ends with its driver, so there
is nothing to release there.
"""

from __future__ import annotations

import time

# the GCS gives a controller this long to stop gracefully, then kills it (Ray's default actor shutdown timeout)
CONTROLLER_GRACE_S = 30.0


def release_leftover_placement_groups(grace_s: float = CONTROLLER_GRACE_S) -> int:
    """Wait (up to grace_s) for this job's Train controllers to end, then remove every placement group this job
    still holds. Returns how many were removed; 0 where Ray's state API is not served (no dashboard)."""
    import ray
    from ray.util.state import list_actors, list_placement_groups

    job = ray.get_runtime_context().get_job_id()
    try:
        deadline = time.monotonic() + grace_s
        while list_actors(filters=[("job_id", "=", job), ("class_name", "=", "TrainController"),
                                   ("state", "!=", "DEAD")]) and time.monotonic() < deadline:
            time.sleep(0.5)
        held = list_placement_groups(filters=[("creator_job_id", "=", job), ("state", "!=", "REMOVED")])
    except Exception:  # noqa: BLE001 - no dashboard on this cluster: the state API is not there to ask
        return 0
    remove_placement_groups([group.placement_group_id for group in held])
    return len(held)


def remove_placement_groups(ids: list[str]) -> None:
    """Remove the placement groups with these (hex) ids, from a driver connected to their cluster."""
    import ray
    from ray.util.placement_group import PlacementGroup

    for group in ids:
        ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(group)))
