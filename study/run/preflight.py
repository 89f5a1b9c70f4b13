"""Every check of a study that needs more than the spec itself, in one place and in the order a driver meets them
(study.run.driver.start, for run, resume and evaluate alike): what the cluster can give, where the trials can reach
the results and data, whether the store can be written. Each refusal is one ConfigError line naming the fix,
raised before any trial starts. The services a study names are opened before Ray starts (study.run.services); a
trial's own checks on its machine are study.trial.preflight."""

from __future__ import annotations

import math
from typing import Any

from study.config import DATA_FILES, build_trial
from study.errors import ConfigError
from study.paths import is_uri
from study.spec import Study
from study.store import Store
from study.trial.preflight import check_writable


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def check_resources(study: Study, cluster: dict[str, float], nodes: list[dict[str, Any]] | None = None) -> None:
    """Refuse what the cluster cannot give (the first of resource_refusals)."""
    refusals = resource_refusals(study, cluster, nodes)
    if refusals:
        raise ConfigError(refusals[0])


def resource_refusals(study: Study, cluster: dict[str, float], nodes: list[dict[str, Any]] | None = None) -> list[str]:
    """Every refusal of what the cluster cannot give, in the order a run meets them (a dry run names them all).
    nodes (Ray's, alive): also what no node can hold."""
    res = study.spec.resources
    out = []
    if res.gpu > 0 and cluster.get("GPU", 0) <= 0:
        out.append(f"{study.source}: resources.gpu={res.gpu} but the cluster has no GPUs; "
                   "allowed here: resources.gpu: 0 (or join a cluster with GPUs via --address)")
    if res.gpu == 0 and any(c.train.device.startswith("cuda") for c in study.trials):
        out.append(f"{study.source}: train.device is 'cuda' but resources.gpu=0, so no trial would get a "
                   "GPU; set resources.gpu (1, or a fraction such as 0.5 to share one)")
    if res.gpu > 0 and any(c.train.device == "cpu" for c in study.trials):
        out.append(f"{study.source}: resources.gpu={res.gpu} but train.device is 'cpu'; set train.device: cuda")
    if res.cpu * res.workers > cluster.get("CPU", 0):
        each = f" for each of resources.workers={res.workers}" if res.workers > 1 else ""
        out.append(f"{study.source}: resources.cpu={res.cpu}{each} but the cluster has only "
                   f"{cluster.get('CPU', 0):g} CPUs")
    if res.workers > 1 and res.gpu * res.workers > cluster.get("GPU", 0):
        out.append(f"{study.source}: resources.workers={res.workers} with resources.gpu={res.gpu} each, but "
                   f"the cluster has only {cluster.get('GPU', 0):g} GPUs")
    if nodes is not None and not out:  # (what one node holds says nothing new once the cluster's total refuses)
        try:
            check_placement(study, nodes)
        except ConfigError as e:
            out.append(str(e))
    uneven = sorted({c.train.batch_size for c in known_configs(study) if c.train.batch_size % res.workers}
                    if res.workers > 1 else ())
    if uneven:
        out.append(f"{study.source}: train.batch_size {uneven[0]} does not split evenly over "
                   f"resources.workers={res.workers} (it is the global batch: each worker trains on "
                   f"batch_size / workers rows); use a multiple of {res.workers}")
    return out


def check_placement(study: Study, nodes: list[dict[str, Any]]) -> None:
    """A trial's workers (or the trial itself) each need resources.cpu / resources.gpu on one node: refuse more than
    the nodes can hold at once, however many CPUs they have in all, naming what each node has."""
    res = study.spec.resources
    have = [n.get("Resources", {}) for n in nodes]
    fits = sum(min(math.floor(h.get("CPU", 0) / res.cpu + 1e-9),
                   math.floor(h.get("GPU", 0) / res.gpu + 1e-9) if res.gpu else math.inf) for h in have)
    if fits >= res.workers:
        return
    per_node = ", ".join(f"{h.get('CPU', 0):g} CPU" + (f" + {h.get('GPU', 0):g} GPU" if res.gpu else "")
                         for h in have)
    who = f"resources.workers={res.workers}, each with" if res.workers > 1 else "a trial needs"
    raise ConfigError(f"{study.source}: {who} resources.cpu={res.cpu:g}" + (f" and resources.gpu={res.gpu:g}"
                      if res.gpu else "") + f" on one node, but the cluster's nodes ({per_node}) can hold "
                      f"{fits} at once; lower resources.cpu or resources.workers, or add nodes")


def known_configs(study: Study) -> list:
    """The study's trial configs (an Optuna search's: its base config)."""
    return study.trials or [build_trial({**study.spec.base(), "seed": study.spec.sweep.seeds[0]}, study.source)]


def data_files(study: Study) -> list[str]:
    """Task data files the study's trials read (the base config's for an Optuna search)."""
    return [path for c in known_configs(study) for section, name in DATA_FILES
            if (path := getattr(getattr(c, section), name))]


def check_storage(root: str, nodes: list[dict[str, Any]], shared: bool, data_files: list[str] = (),
                  here: str | None = None) -> None:
    """Paths local to this machine (the results root, task data files) cannot serve nodes on other machines.
    here: this machine's node address (default: Ray's)."""
    if shared:
        return
    local = ([root] if not is_uri(root) else []) + sorted(set(data_files))
    if not local:
        return
    if here is None:
        import ray

        here = ray.util.get_node_ip_address()
    addresses = {n.get("NodeManagerAddress", "") for n in nodes}
    remote = sorted(a for a in addresses if a and a != here and not (is_loopback(a) and is_loopback(here)))
    if remote:
        what = (f"storage {root!r} is a path on this machine" if local[0] == root else
                f"task data {local[0]!r} is a file on this machine")
        raise ConfigError(
            f"{what}, but the cluster has nodes on other machines ({', '.join(remote)}); their trials could not "
            "reach it. Use shared storage: an NFS path mounted on every node (and pass --shared-storage), or for "
            "results an object store such as s3://bucket/prefix.")


def check_node_plugins(study: Study, nodes: list[dict[str, Any]]) -> None:
    """Every alive node must import each outside plugin the study runs, at the driver's version: a node that lacks
    one, has another version or cannot import it is refused, naming the node and the plugin (docs/clusters.md says
    how to ship one)."""
    if not study.plugins:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from study.plugins import node_report

    wanted = [(p.group, p.name) for p in study.plugins]
    probe = ray.remote(num_cpus=0, max_retries=0)(node_report)
    alive = [n for n in nodes if n.get("Alive", True)]
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(wanted)
            for n in alive]
    for node, got in zip(alive, ray.get(refs, timeout=120)):
        for p in study.plugins:
            there = got.get(f"{p.group}:{p.name}")
            if there != p.pin:
                has = there if there in ("not installed",) or there.startswith("does not import") else f"has {there}"
                raise ConfigError(f"{study.source}: node {node.get('NodeManagerAddress', '?')} "
                                  f"({node['NodeID'][:12]}) {has} for plugin {p.name!r} ({p.group}), and the driver "
                                  f"runs {p.pin}; install {p.pin} on every node (docs/clusters.md: the image or "
                                  "runtime_env's pip list)")


def preflight_study(study: Study, store: Store, *, cluster: dict[str, float], nodes: list[dict[str, Any]],
                    shared: bool) -> None:
    """Every check of a study on a cluster, in order (its services were opened before Ray started:
    study.run.services)."""
    check_resources(study, cluster, nodes)
    check_storage(store.uri, nodes, shared, data_files(study))
    check_node_plugins(study, nodes)
    check_writable(store)


