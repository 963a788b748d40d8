#!/usr/bin/env python3
"""TensorFlow's own tf.distribute.MultiWorkerMirroredStrategy on the problem of examples/train.

A bench-time comparison only: it is not part of libmwms's build or tests, and TensorFlow is not a
dependency of the repository. Install TF in a virtual environment outside the repository:

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install 'tensorflow-cpu==2.21.*'

What it measures: the same model, data, optimizer and batch as `build/bin/train`:
Fashion-MNIST (IDX gzip files, read with the standard library and numpy, pixels centred and scaled
with the same mean/std as examples/train/input.cc), an MLP 784 -> Dense 256 ReLU -> Dense 10,
softmax cross-entropy scaled by 1/global batch (tf.nn.compute_average_loss), SGD with momentum 0.9
and lr 0.01 (Keras' form of momentum, the same trajectory as PyTorch's at a constant lr), global
batch 64 split across the workers by strategy.experimental_distribute_dataset. A custom training
loop (strategy.run inside tf.function) runs --steps global steps (default: one epoch, 937); the
first --warmup steps (tracing, collective setup) are not timed. Worker 0 prints images/s of the
timed steps (global batch * timed steps / seconds; steps are synchronous, so the slowest worker
sets the pace) and the test accuracy of the trained model.

How to run it (TF_CPP_MIN_LOG_LEVEL=2 quiets TF's C++ logging):

    TF_CPP_MIN_LOG_LEVEL=2 /tmp/tfvenv/bin/python3 scripts/tf_mwms_baseline.py --workers 1
    TF_CPP_MIN_LOG_LEVEL=2 /tmp/tfvenv/bin/python3 scripts/tf_mwms_baseline.py --workers 2 --steps 400

--workers 1 runs one worker in this process without TF_CONFIG. --workers N > 1 starts N local
worker processes, each with its own TF_CONFIG on free loopback ports (as scripts/run_main.sh does
for libmwms), waits for all of them and prints worker 0's output (a failing worker's log too).
"""
import argparse
import gzip
import json
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530  # as examples/train/input.cc


def read_idx(path):
    """An IDX file (gzip) as a numpy uint8 array of its shape."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_split(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return (x - PIXEL_MEAN) / PIXEL_STD, labels.astype(np.int32)


def train(args):
    import tensorflow as tf
    import keras

    # Must come first: it reads TF_CONFIG and starts this worker's gRPC server.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    leader = task.get("index", 0) == 0
    x_train, y_train = load_split(args.data_dir, "train")
    x_test, y_test = load_split(args.data_dir, "t10k")
    batch = args.batch_size

    # Same seed on every worker: the same shuffle, which the default (DATA) auto-shard needs.
    dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
               .shuffle(len(x_train), seed=args.seed, reshuffle_each_iteration=True)
               .batch(batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    with strategy.scope():
        keras.utils.set_random_seed(args.seed)
        model = keras.Sequential([keras.Input((x_train.shape[1],)),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=None)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)),
                                              global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))  # sums across replicas
        return loss

    @tf.function
    def train_step(inputs):
        losses = strategy.run(replica_step, args=inputs)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    warmup = min(args.warmup, args.steps - 1)
    for _ in range(warmup):
        train_step(next(iterator)).numpy()
    start = time.perf_counter()
    loss_sum = 0.0
    for _ in range(args.steps - warmup):
        loss_sum += train_step(next(iterator))
    loss_sum = float(loss_sum)  # waits for the last step
    seconds = time.perf_counter() - start
    timed = args.steps - warmup

    logits = model(x_test, training=False)  # mirrored weights, identical on every worker
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    if leader:
        print(f"tf {tf.__version__}: {strategy.num_replicas_in_sync} replica(s) in sync, "
              f"global batch {batch}, {args.steps} steps ({warmup} warm-up), lr {args.lr}")
        print(f"timed {timed} steps: loss {loss_sum / timed:.4f}, test accuracy {accuracy:.4f}, "
              f"{timed * batch / seconds:.0f} images/s, {seconds:.2f} s", flush=True)


def free_ports(count):
    """Ports in 20000-31999 (below Linux's ephemeral range, like run_main.sh) that bind now."""
    ports = []
    while len(ports) < count:
        port = random.randint(20000, 31999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def launch(args, argv):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(args.workers)]}
    print(f"launching {args.workers} workers on {', '.join(cluster['worker'])}", flush=True)
    procs, logs = [], []
    for index in range(args.workers):
        env = dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}))
        logs.append(tempfile.TemporaryFile("w+"))  # a file, not a pipe: it never fills up
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker"] + argv, env=env,
            stdout=logs[-1], stderr=subprocess.STDOUT))
    # Wait for all; the first failure stops the others instead of leaving them blocked.
    status = {}
    while len(status) < len(procs):
        for index, proc in enumerate(procs):
            if index not in status and proc.poll() is not None:
                status[index] = proc.returncode
                if proc.returncode != 0:
                    for other in procs:
                        if other.poll() is None:
                            other.kill()
        time.sleep(0.5)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
    print(outputs[0], end="")
    failed = [i for i, rc in status.items() if rc != 0]
    for index in failed:
        if index != 0:
            print(f"--- worker {index} (exit status {status[index]}):\n{outputs[index]}", end="")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="local worker processes")
    parser.add_argument("--steps", type=int, default=60000 // 64,
                        help="global steps in all, warm-up included (default: one epoch)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed first steps")
    parser.add_argument("--batch_size", type=int, default=64, help="GLOBAL batch size")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.workers < 1:
        parser.error("--steps and --workers must be positive")
    if args.worker:
        train(args)
        return 0
    if args.workers == 1:
        os.environ.pop("TF_CONFIG", None)
        train(args)
        return 0
    # The workers get this command line without --workers N / --workers=N.
    cleaned, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--workers":
            skip = True
        elif not a.startswith("--workers="):
            cleaned.append(a)
    return launch(args, cleaned)


if __name__ == "__main__":
    sys.exit(main())
