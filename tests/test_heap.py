"""A trial's process keeps a layer's freed memory on the heap (study/trial/heap.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# A rollout at batch 64 (activations of 256 KiB, above glibc's starting mmap threshold), its page faults counted
# per layer once warm. Under glibc's adaptive thresholds this process often took 100-180 faults per layer.
ROLLOUT = """
import resource, sys
import torch
from study.trial.heap import keep_freed_memory
assert keep_freed_memory()
from study.models import CarryConfig, ModelConfig, build_reasoner
from study.tasks import TaskSpec
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = ModelConfig(hidden=64, heads=4, n_layers=2, H=2, L=4, carry=CarryConfig(rule="carry_last", placement="both"))
model = build_reasoner(cfg, TaskSpec("sudoku", 6, 16, (4, 4))).eval()
tokens = torch.randint(0, 6, (64, 16))
with torch.no_grad():
    model.rollout(tokens, 5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model.rollout(tokens, 30)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (30 * cfg.layers_per_step))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")
def test_a_rollout_reuses_its_freed_memory_instead_of_faulting_it_in_at_every_layer():
    out = subprocess.run([sys.executable, "-c", ROLLOUT], capture_output=True, text=True, check=True)
    faults_per_layer = float(out.stdout.strip().splitlines()[-1])
    assert faults_per_layer < 5  # 0.3-0.5 measured: none of a layer's 256 KiB activations is faulted in again


def test_keeping_freed_memory_is_a_no_op_where_the_c_library_is_not_glibc(monkeypatch):
    from study.trial import heap

    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("", ""))
    assert heap.keep_freed_memory() is False
