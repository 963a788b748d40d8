"""Training functions of the Spark tests (test_spark.py). The tests ship this file to Spark's
executors with SparkContext.addPyFile, as a user ships their own code, so that train_fn pickles
by reference; local mode finds it on the driver's sys.path, which the slots inherit.

The model: a one-hidden-layer MLP (4 -> 8 ReLU -> 3, softmax cross-entropy) in NumPy, float32,
trained with SGD on a global batch of 8 rows, each worker computing the gradient of the loss
summed over its shard and divided by the global batch size (TF's compute_average_loss)."""
from __future__ import annotations

import json
import os
import time

import numpy as np

import mwms
import mwms.spark

GLOBAL_BATCH = 8
LEARNING_RATE = np.float32(0.5)


def data():
    rng = np.random.default_rng(17)
    x = rng.standard_normal((GLOBAL_BATCH, 4)).astype(np.float32)
    y = rng.integers(0, 3, GLOBAL_BATCH)
    return x, y


def initial_params():
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((4, 8)) * 0.5).astype(np.float32), np.zeros(8, np.float32),
            (rng.standard_normal((8, 3)) * 0.5).astype(np.float32), np.zeros(3, np.float32)]


def gradients(params, x, y):
    """Gradients of sum(cross-entropy over these rows) / GLOBAL_BATCH."""
    w1, b1, w2, b2 = params
    h_pre = x @ w1 + b1
    h = np.maximum(h_pre, 0)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    d_logits = p
    d_logits[np.arange(len(y)), y] -= 1
    d_logits /= np.float32(GLOBAL_BATCH)
    d_h = (d_logits @ w2.T) * (h_pre > 0)
    return [x.T @ d_h, d_h.sum(axis=0), h.T @ d_logits, d_logits.sum(axis=0)]


def sgd(params, grads):
    for p, g in zip(params, grads):
        p -= LEARNING_RATE * g


def train_mlp(steps):
    """train_fn: runs with the strategy MirroredStrategyRunner made (use_custom_strategy=False)."""
    strategy = mwms.spark.get_strategy()
    params = initial_params()
    if strategy.worker_index != 0:
        for p in params:  # the chief's initial values must win
            p += 1
    strategy.broadcast_variables(params)
    x, y = data()
    rows = strategy.batch_shard(GLOBAL_BATCH)
    for _ in range(steps):
        grads = gradients(params, x[rows], y[rows])
        strategy.all_reduce_gradients(grads)
        sgd(params, grads)
    checksum = float(sum(p.astype(np.float64).sum() for p in params))
    return {
        "params": params,
        "worker_index": strategy.worker_index,
        "num_workers": strategy.num_workers,
        "is_chief": strategy.is_chief,
        "sum_of_ranks_plus_one": strategy.reduce("sum", float(strategy.worker_index + 1)),
        "workers_agree": strategy.reduce("max", checksum) == strategy.reduce("min", checksum),
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "auth_key_file": os.environ.get("MWMS_AUTH_KEY_FILE", ""),
        "auth_key_in_environment": "MWMS_AUTH_KEY" in os.environ,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def reference(steps, shards=((0, 4), (4, 8))):
    """One process: the gradient of each shard summed in worker order (what all_reduce of 2
    workers computes, bit for bit); shards=((0, 8),) is one gradient over the global batch."""
    params = initial_params()
    x, y = data()
    for _ in range(steps):
        per_shard = [gradients(params, x[a:b], y[a:b]) for a, b in shards]
        grads = [sum(gs[1:], gs[0]) for gs in zip(*per_shard)]
        sgd(params, grads)
    return params


class TrainingDiverged(Exception):
    """A user's own exception class: run() must raise it as itself."""


def check_loss(step, loss):
    if not np.isfinite(loss):
        raise TrainingDiverged(f"loss is {loss} at step {step} on worker 1")


def train_fails():
    """Worker 1 raises; worker 0 is blocked in an all-reduce with it meanwhile."""
    strategy = mwms.spark.get_strategy()
    if strategy.worker_index == 1:
        time.sleep(0.5)
        check_loss(3, float("nan"))
    strategy.all_reduce_gradients([np.ones(4, np.float32)])
    return "unreachable"


def train_hangs(pid_dir, timeout_seconds):
    """use_custom_strategy=True: worker 1 hangs in Python, worker 0's all-reduce times out."""
    comm = mwms.Communicator(timeout_seconds=timeout_seconds)
    if comm.rank == 1:
        with open(os.path.join(pid_dir, "hung.pid"), "w") as f:
            f.write(f"{os.getpid()} {os.path.dirname(os.environ['MWMS_AUTH_KEY_FILE'])}")
        time.sleep(600)
    comm.all_reduce(np.ones(4, np.float32))
    return "unreachable"


def communicator_ranks():
    """use_custom_strategy=True: train_fn makes its own communicator from the TF_CONFIG."""
    with mwms.Communicator() as comm:
        x = np.array([comm.rank + 1], np.int64)
        comm.all_reduce(x)
        cluster = comm.cluster
        return {"rank": comm.rank, "world_size": comm.world_size, "sum": int(x[0]),
                "is_chief": cluster.is_chief, "ring": list(cluster.ring)}
