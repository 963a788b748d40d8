"""examples/python/train_mlp.py, shortened: it learns, and 2 workers follow 1 worker on the same
global batch (the strategy's equivalence contract)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python" / "train_mlp.py"
DATA = "/usr/share/datasets/fashion-mnist"


def train(tmp_path: Path, workers: int, steps: int, replicas: int = 1) -> dict:
    metrics = tmp_path / f"metrics-{workers}x{replicas}.json"
    cmd = [sys.executable, str(EXAMPLE), "--epochs", "1", "--max_steps_per_epoch", str(steps),
           "--metrics_file", str(metrics), "--local_replicas", str(replicas)]
    if workers > 1:
        launcher = os.path.join(os.path.dirname(sys.executable), "mwmsrun")
        cmd = [launcher, "-np", str(workers), "--"] + cmd
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(metrics.read_text())


@pytest.mark.skipif(not os.path.isdir(DATA), reason="Fashion-MNIST not installed "
                    "(scripts/setup.sh installs dataset-fashion-mnist)")
def test_two_workers_follow_one(tmp_path):
    one = train(tmp_path, 1, 100)
    two = train(tmp_path, 2, 100)
    assert two["workers"] == 2 and one["workers"] == 1
    assert one["test_accuracy"] > 0.75  # it learns (0.805 after 100 steps; 0.10 untrained)
    # Same global batches, same initial weights: only float rounding differs (the sums of two
    # half-batch gradients instead of one; 6e-9 apart in the loss here).
    assert abs(one["test_accuracy"] - two["test_accuracy"]) <= 0.001
    assert abs(one["loss"] - two["loss"]) <= 1e-5
    # 1 worker x 2 local replicas: the same two half-batches summed in the same order (a sum of
    # two numbers has one rounding either way), so the same bits as 2 workers.
    local = train(tmp_path, 1, 100, replicas=2)
    assert (local["workers"], local["local_replicas"]) == (1, 2)
    assert local["loss"] == two["loss"] and local["test_accuracy"] == two["test_accuracy"]
