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
is a leftover. Released through Ray's state API (the dashboard's), asked of this driver's own cluster by its GCS
address: with no address that API looks for the Ray on this machine and refuses when it finds two (a second cluster,
another driver's embedded Ray). Only for a driver on a cluster: an embedded Ray ends with its driver, so there is
nothing to release there, and no dashboard to ask.
"""

from __future__ import annotations

import time

from study.console import eprint

# the GCS gives a controller this long to stop gracefully, then kills it (Ray's default actor shutdown timeout)
CONTROLLER_GRACE_S = 30.0


def release_leftover_placement_groups(grace_s: float = CONTROLLER_GRACE_S) -> int:
    """Wait (up to grace_s) for this job's Train controllers to end, then remove every placement group this job
    still holds. Returns how many were removed. Call it from a driver connected to a cluster. It runs after a
    study's trials, so it must not turn a finished run into a failed one: whatever fails here (the cluster serves
    no state API, started without its dashboard; a removal Ray refuses) is said in a line, never raised."""
    import ray
    from ray.util.state import list_actors, list_placement_groups

    if not ray.is_initialized():  # the driver's cluster is gone: nothing to ask (and asking would start a Ray)
        eprint("warning: not connected to the cluster any more: placement groups this run's stopped trials left "
               "reserved were not looked for; `ray list placement-groups --detail` on the head shows them")
        return 0
    try:
        context = ray.get_runtime_context()
        job, cluster = context.get_job_id(), context.gcs_address
        deadline = time.monotonic() + grace_s
        while list_actors(address=cluster, filters=[("job_id", "=", job), ("class_name", "=", "TrainController"),
                                                    ("state", "!=", "DEAD")]) and time.monotonic() < deadline:
            time.sleep(0.5)
        held = list_placement_groups(address=cluster, filters=[("creator_job_id", "=", job),
                                                               ("state", "!=", "REMOVED")])
        failed = remove_placement_groups([group.placement_group_id for group in held])
    except Exception as e:  # noqa: BLE001 - Ray raises several kinds here, none of them a reason to fail the run
        eprint(f"warning: could not look for placement groups this run's stopped trials left reserved "
               f"({_reason(e)}); `ray list placement-groups --detail` on the head shows them")
        return 0
    for group, e in failed.items():
        eprint(f"warning: placement group {group}, which a stopped trial left reserved, could not be removed "
               f"({_reason(e)}); `ray list placement-groups --detail` on the head shows it")
    return len(held) - len(failed)


def _reason(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def remove_placement_groups(ids: list[str]) -> dict[str, Exception]:
    """Remove the placement groups with these (hex) ids, from a driver connected to their cluster; returns the ones
    that could not be removed, with why (each is tried)."""
    import ray
    from ray.util.placement_group import PlacementGroup

    failed = {}
    for group in ids:
        try:
            ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(group)))
        except Exception as e:  # noqa: BLE001 - whatever Ray says of one group, the others are still tried
            failed[group] = e
    return failed
