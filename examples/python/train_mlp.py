"""The Fashion-MNIST MLP of `train` (784 -> 256 ReLU -> 10, softmax cross-entropy, momentum 0.9)
written in NumPy, trained data-parallel through mwms.MultiWorkerMirroredStrategy.

    mwmsrun -np 2 -- python examples/python/train_mlp.py            # 2 workers, one TF_CONFIG each
    python examples/python/train_mlp.py --epochs 1                    # one process
    python examples/python/train_mlp.py --local_replicas 2            # one process, 2 replicas

Same recipe as `build/bin/train --model mlp` (docs/python.md, "Example"): Glorot-uniform
weights, zero biases, pixels standardised with the training set's mean and deviation, a global
batch of 64 split between the workers (batch_shard), each worker's gradient of its rows' summed
loss divided by the GLOBAL batch size (tf.nn.compute_average_loss), summed across workers by
all_reduce_gradients, then TF's ApplyMomentum on every worker. Every epoch reshuffles the
training set from the seed; every worker draws the same permutation and takes its own rows of
each global batch. The step is TF's `strategy.run(train_step)`: with --local_replicas K each
worker drives K replicas (threads), each with its own copy of the model and its own rows, and
ReplicaContext.all_reduce sums the gradients of every replica of every worker; 1 worker x 2
replicas follows 2 workers exactly.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import time

# One BLAS thread per worker unless told otherwise: several workers per host each running a
# thread per core oversubscribe it (25x slower on 2 cores with 2 workers).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402 (after the thread settings, which numpy reads at import)

import mwms  # noqa: E402

DATA_DIR = "/usr/share/datasets/fashion-mnist"
# The training set's pixel mean and standard deviation on [0, 1], as train's input pipeline
# (examples/train/input.cc) centres and scales the inputs.
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


def read_idx(path: str, offset: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load(data_dir: str, split: str):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"), 8)
    x = (images.reshape(-1, 784).astype(np.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return x.astype(np.float32), labels.astype(np.int64)


def glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)


class Mlp:
    """Weights, momentum accumulators and gradients, each one contiguous float32 array."""

    def __init__(self, seed: int, hidden: int = 256):
        rng = np.random.default_rng(seed)
        self.params = [glorot(rng, 784, hidden), np.zeros(hidden, np.float32),
                       glorot(rng, hidden, 10), np.zeros(10, np.float32)]
        self.grads = [np.zeros_like(p) for p in self.params]
        self.accum = [np.zeros_like(p) for p in self.params]

    def logits(self, x: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2 = self.params
        return np.maximum(x @ w1 + b1, 0) @ w2 + b2

    def backward(self, x: np.ndarray, y: np.ndarray, global_batch: int) -> float:
        """Fills self.grads with d(sum of the rows' losses / global_batch); returns that loss."""
        w1, b1, w2, b2 = self.params
        h = np.maximum(x @ w1 + b1, 0)
        z = h @ w2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(-np.log(p[rows, y] + 1e-12).sum() / global_batch)
        p[rows, y] -= 1
        dz = p / global_batch
        dh = (dz @ w2.T) * (h > 0)
        np.matmul(x.T, dh, out=self.grads[0])
        self.grads[1][...] = dh.sum(axis=0)
        np.matmul(h.T, dz, out=self.grads[2])
        self.grads[3][...] = dz.sum(axis=0)
        return loss

    def apply_momentum(self, lr: float, momentum: float) -> None:
        """TF's ApplyMomentum: accum = momentum * accum + grad; var -= lr * accum."""
        for p, g, a in zip(self.params, self.grads, self.accum):
            a *= momentum
            a += g
            p -= lr * a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch_size", type=int, default=64, help="global batch")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data_dir", default=DATA_DIR)
    ap.add_argument("--max_steps_per_epoch", type=int, default=0, help="0: the whole epoch")
    ap.add_argument("--metrics_file", default="", help="the chief writes a JSON summary here")
    ap.add_argument("--local_replicas", type=int, default=1, help="replicas per worker (K)")
    args = ap.parse_args()

    strategy = mwms.MultiWorkerMirroredStrategy(local_replicas=args.local_replicas)
    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "t10k")
    models = [Mlp(args.seed) for _ in range(strategy.num_local_replicas)]  # one per replica

    def init() -> None:  # every replica starts from the chief's replica 0 weights
        ctx = mwms.get_replica_context()
        ctx.broadcast_variables(models[ctx.local_replica_id].params)

    def train_step(batch: np.ndarray) -> float:  # batch: the global batch's indices
        ctx = mwms.get_replica_context()
        model = models[ctx.local_replica_id]
        mine = batch[ctx.batch_shard(args.batch_size)]  # this replica's rows
        loss = model.backward(x_train[mine], y_train[mine], args.batch_size)
        ctx.all_reduce("sum", model.grads)  # summed over every replica, in place
        model.apply_momentum(args.lr, args.momentum)
        return loss

    strategy.run(init)
    steps = len(x_train) // args.batch_size
    if args.max_steps_per_epoch > 0:
        steps = min(steps, args.max_steps_per_epoch)
    chief = strategy.is_chief
    if chief:
        print(f"train_mlp: {strategy.num_workers} worker(s) x {strategy.num_local_replicas} "
              f"replica(s), global batch {args.batch_size}, {steps} step(s)/epoch, lr {args.lr}, "
              f"momentum {args.momentum}", flush=True)
    accuracy = loss = 0.0
    for epoch in range(args.epochs):
        start = time.perf_counter()
        order = np.random.default_rng([args.seed, epoch]).permutation(len(x_train))
        loss_sum = 0.0
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            losses = strategy.run(train_step, args=(batch,))
            loss_sum += sum(strategy.experimental_local_results(losses))
        # Every replica holds the same weights: each worker evaluates one, the chief reports.
        accuracy = float((models[0].logits(x_test).argmax(axis=1) == y_test).mean())
        loss = strategy.reduce("sum", loss_sum) / steps  # the global batch's mean loss
        seconds = time.perf_counter() - start
        if chief:
            print(f"epoch {epoch + 1}: loss {loss:.4f}, test accuracy {accuracy:.4f}, "
                  f"{steps * args.batch_size / seconds:.0f} images/s", flush=True)
    strategy.finalize()
    if chief:
        print(f"final test accuracy: {accuracy:.4f}", flush=True)
        if args.metrics_file:
            with open(args.metrics_file, "w") as f:
                json.dump({"test_accuracy": accuracy, "loss": loss, "epochs": args.epochs,
                           "steps_per_epoch": steps, "workers": strategy.num_workers,
                           "local_replicas": strategy.num_local_replicas}, f)


if __name__ == "__main__":
    main()
