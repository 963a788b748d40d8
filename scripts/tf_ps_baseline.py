#!/usr/bin/env python3
"""TensorFlow's own parameter-server training on the problem of examples/train's ps mode.

A bench-time comparison only, like scripts/tf_mwms_baseline.py (whose data and port helpers it
imports): it is not part of libmwms's build or tests, and TensorFlow is not a dependency of the
repository. It is TF's counterpart of `mwmsrun -np 2 --ps 1 -- train --epochs 1` (add
--sync_replicas for sync), as scripts/bench_ps_train.sh runs it. Install TF outside the repository:

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install 'tensorflow-cpu==2.21.*' numpy

The problem is tf_mwms_baseline.py's: Fashion-MNIST from the IDX gzip files (pixels centred and
scaled with examples/train/input.cc's mean/std), an MLP 784 -> Dense 256 ReLU -> Dense 10 (glorot-
uniform kernels from --seed, zero biases, the same start in every mode), softmax cross-entropy,
momentum 0.9, lr 0.01, global batch 64 = 32 per worker, 1 ps + 2 workers on loopback, one epoch.
The input is read and shuffled by tf.data on each worker (the files are read by TF ops, so no
60000-image constant travels in a graph): the same seeded order on every worker, each global
batch of 64 split into a 32-row half per worker, as libmwms's ps trainer does. --mode:

  async  TF 1: tf.compat.v1 graph mode, a tf.distribute.Server per task from one ClusterSpec,
         replica_device_setter, MonitoredTrainingSession(master=server.target, is_chief=task 0),
         MomentumOptimizer (the trajectory of Keras' SGD momentum at a constant lr); the ps task
         server.join()s. Every push applies one worker's gradient of the mean loss over its 32
         rows (as libmwms's ps-async), so TF's global_step counts pushes and one epoch is
         --steps x workers = 1874 pushes of 32 (StopAtStepHook on the global step: about 937
         per worker, the faster one does more). Total images = one epoch (59,968).
  sync   the same with SyncReplicasOptimizer(replicas_to_aggregate=2, total_num_replicas=2) and
         its hook: each global step averages 2 gradients of 32 rows, i.e. the gradient of the mean
         loss over the global batch of 64; --steps (937) global steps.
  pss    TF 2: tf.distribute.experimental.ParameterServerStrategy + ClusterCoordinator; a chief
         process (the coordinator) beside the ps and 2 workers (which only run a Server). A per-
         worker dataset (coordinator.create_per_worker_dataset, sharded by
         experimental_get_current_worker_index), Keras' model and SGD, one coordinator.schedule
         per step of 32 rows; --steps x workers = 1874 scheduled steps, each applied on its own
         (asynchronous, as async): the coordinator hands each step to whichever worker is free,
         so the two workers' halves advance at their own pace (seen: 926 + 948 steps).

The first --warmup global steps (of 64 images: --warmup x workers pushes in async and pss) are not
timed. images/s = images applied to the model in the timed steps / seconds they took. For async
and sync it is the span across the workers: from the earliest worker's end of warm-up to the
latest worker's last step (wall clocks of one machine), images = the global_step advance over that
span x images per global step (32 in async, 64 in sync). For pss it is the coordinator's clock:
from the join() after the warm-up steps to the join() after the last one. Test accuracy: of the
final weights (read from the ps after every worker finished) on the 10k test set.

How to run it (TF_CPP_MIN_LOG_LEVEL=2 quiets TF's C++ logging):

    TF_CPP_MIN_LOG_LEVEL=2 /tmp/tfvenv/bin/python3 scripts/tf_ps_baseline.py --mode async
    TF_CPP_MIN_LOG_LEVEL=2 /tmp/tfvenv/bin/python3 scripts/tf_ps_baseline.py --mode sync
    TF_CPP_MIN_LOG_LEVEL=2 /tmp/tfvenv/bin/python3 scripts/tf_ps_baseline.py --mode pss
    TF_CPP_MIN_LOG_LEVEL=2 /tmp/tfvenv/bin/python3 scripts/tf_ps_baseline.py --mode async \
        --json /tmp/tf_async.json   # also --steps N, --warmup N, --timeout SECONDS

It starts every task itself (1 ps, 2 workers, and a chief in pss) as a child process on free
loopback ports, waits for the workers (pss: the chief) to finish, then kills the ps (which never
exits by itself) and the pss worker servers. A failing task, a ps that exits, --timeout, a signal
or the launcher's own death ends all of them (children get SIGKILL when the launcher dies). The
last line printed is `images_per_sec N test_accuracy A mode M`; --json FILE writes the same keys
(and a few more) as JSON. Exit status 0 on success, 1 on any failure (with the tasks' log tails).
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from tf_mwms_baseline import PIXEL_MEAN, PIXEL_STD, free_ports, load_split

IMAGE_PIXELS, HIDDEN, CLASSES = 784, 256, 10
TRAIN_SIZE = 60000


def initial_weights(seed):
    """Keras Dense's initialisation (glorot-uniform kernels, zero biases), from a numpy seed."""
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in ((IMAGE_PIXELS, HIDDEN), (HIDDEN, CLASSES)):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        weights.append(rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32))
        weights.append(np.zeros(fan_out, np.float32))
    return weights


def test_accuracy(weights, data_dir):
    """Accuracy of the MLP with weights [w1, b1, w2, b2] on the 10k test set (numpy)."""
    x, y = load_split(data_dir, "t10k")
    w1, b1, w2, b2 = weights
    logits = np.maximum(x @ w1 + b1, 0.0) @ w2 + b2
    return float(np.mean(np.argmax(logits, axis=1) == y))


def train_dataset(tf, args, num_workers, worker_index):
    """This worker's half of every global batch, read from the IDX gzip files by TF ops.

    The same seeded shuffle on every worker (so the halves partition each global batch, as
    load_split's arrays would be split); worker_index may be a tensor (pss).
    """
    def load(_):
        def idx(name, header):  # header: 4 + 4 * ndim bytes (images 3-D, labels 1-D)
            raw = tf.io.decode_compressed(tf.io.read_file(os.path.join(args.data_dir, name)),
                                          compression_type="GZIP")
            return tf.io.decode_raw(tf.strings.substr(raw, header, tf.strings.length(raw) - header),
                                    tf.uint8)
        pixels = tf.reshape(idx("train-images-idx3-ubyte.gz", 16), [-1, IMAGE_PIXELS])
        x = (tf.cast(pixels, tf.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD  # as load_split
        return x, tf.cast(idx("train-labels-idx1-ubyte.gz", 8), tf.int32)

    per_worker = args.batch_size // num_workers
    begin = per_worker * worker_index
    return (tf.data.Dataset.from_tensors(0).map(load).unbatch().cache()
            .shuffle(TRAIN_SIZE, seed=args.seed, reshuffle_each_iteration=True)
            .batch(args.batch_size, drop_remainder=True)
            .map(lambda x, y: (x[begin:begin + per_worker], y[begin:begin + per_worker]))
            .repeat().prefetch(tf.data.AUTOTUNE))


def serve(cluster, job, index):
    """A ps task (and in pss a worker): a gRPC server that runs what the others send it."""
    import tensorflow as tf
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                         protocol="grpc", start=True).join()


def tf1_worker(args, cluster, index, result_path):
    """A worker of the async and sync modes: TF 1 between-graph replication."""
    import tensorflow as tf
    v1 = tf.compat.v1
    v1.disable_eager_execution()
    spec = tf.train.ClusterSpec(cluster)
    server = tf.distribute.Server(spec, job_name="worker", task_index=index, start=True)
    workers, chief, sync = len(cluster["worker"]), index == 0, args.mode == "sync"
    last_step = args.steps if sync else args.steps * workers  # global_step counts pushes in async
    warmup = min(args.warmup, args.steps - 1)  # local steps, one per global step of 64 images
    v1.set_random_seed(args.seed)
    setter = v1.train.replica_device_setter(worker_device=f"/job:worker/task:{index}",
                                            cluster=spec)
    with v1.device(setter):
        x, y = v1.data.make_one_shot_iterator(train_dataset(tf, args, workers, index)).get_next()
        names = ("dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias")
        params = [v1.get_variable(n, initializer=tf.constant(w))
                  for n, w in zip(names, initial_weights(args.seed))]
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, params[0]) + params[1]), params[2]) + params[3]
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                             logits=logits))
        global_step = v1.train.get_or_create_global_step()
        optimizer = v1.train.MomentumOptimizer(args.lr, momentum=0.9)
        hooks = [v1.train.StopAtStepHook(last_step=last_step)]
        if sync:
            optimizer = v1.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=workers,
                                                       total_num_replicas=workers)
            # No spare tokens (the default is replicas_to_aggregate): each worker pushes one
            # gradient per global step and waits for that step's update, so neither can run a
            # step ahead and be left waiting for a partner that has stopped at last_step.
            hooks.append(optimizer.make_session_run_hook(chief, num_tokens=0))
        train_op = optimizer.minimize(loss, global_step=global_step)
        with tf.control_dependencies([train_op]):
            step_after = tf.identity(global_step)
        counters = [v1.get_variable(n, [], tf.int64, v1.zeros_initializer(), trainable=False)
                    for n in ("barrier_start", "barrier_done")]
        arrive = [c.assign_add(1) for c in counters]
    uninitialized = v1.report_uninitialized_variables(v1.global_variables())
    result = {}

    def barrier(session, which, timeout):
        session.run(arrive[which])
        deadline = time.time() + timeout
        while session.run(counters[which]) < workers:
            if time.time() > deadline:
                return False
            time.sleep(0.01)
        return True

    class Barriers(v1.train.SessionRunHook):
        """Start together (untimed); at the end the chief reads the weights once all are done."""

        def after_create_session(self, session, coord):
            barrier(session, 0, args.timeout)

        def end(self, session):
            if not chief:
                session.run(arrive[1])
                return
            result["all_done"] = barrier(session, 1, 120)
            result["test_accuracy"] = test_accuracy(session.run(params), args.data_dir)
            result["global_step"] = int(session.run(global_step))

    # device_filters: this worker's session needs only the ps and itself, not the other worker.
    config = v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{index}"])
    if not chief:
        # MonitoredTrainingSession's wait for the chief's initialisation polls every 30 s; poll
        # here instead, so that the run does not idle for up to 30 s before it starts.
        with v1.Session(server.target, config=config) as session:
            while len(session.run(uninitialized)):
                time.sleep(0.05)
    steps, start, step = 0, None, None
    with v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=chief, hooks=hooks + [Barriers()], config=config,
            checkpoint_dir=None, save_checkpoint_secs=None, save_summaries_steps=None,
            save_summaries_secs=None, log_step_count_steps=0,
            # sync: the chief's queue runner stays blocked on the next step's gradients, which
            # never come; close() would wait 120 s (the default) for it before ignoring it.
            stop_grace_period_secs=2) as session:
        while not session.should_stop():
            step = int(session.run(step_after))
            steps += 1
            if steps == warmup:
                start = (time.time(), step)
        end = (time.time(), step)
    result.update(worker=index, local_steps=steps, start=start, end=end, tensorflow=tf.__version__,
                  images_per_global_step=args.batch_size if sync else args.batch_size // workers)
    with open(result_path, "w") as f:
        json.dump(result, f)


def pss_chief(args, cluster, result_path):
    """The coordinator of the pss mode: TF 2 ParameterServerStrategy + ClusterCoordinator."""
    import tensorflow as tf
    import keras

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    workers = len(cluster["worker"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((IMAGE_PIXELS,)),
                                  keras.layers.Dense(HIDDEN, activation="relu"),
                                  keras.layers.Dense(CLASSES)])
        model.set_weights(initial_weights(args.seed))
        optimizer = keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)  # mean over the 32

    def dataset_fn(_):
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        return train_dataset(tf, args, workers, index)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def train_step(iterator):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return (strategy.run(replica_step, args=next(iterator)),
                tf.distribute.coordinator.experimental_get_current_worker_index())

    total = args.steps * workers
    warmup = min(args.warmup, args.steps - 1) * workers
    outputs = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(warmup)]
    coordinator.join()
    start = time.time()
    for _ in range(total - warmup):
        outputs.append(coordinator.schedule(train_step, args=(iterator,)))
    coordinator.join()
    seconds = time.time() - start
    outputs = [o.fetch() for o in outputs]  # (loss, index of the worker that ran the step)
    per_worker = [sum(1 for _, w in outputs if w == i) for i in range(workers)]
    result = {"images": (total - warmup) * (args.batch_size // workers), "seconds": seconds,
              "scheduled_steps": total, "per_worker": per_worker, "tensorflow": tf.__version__,
              "last_loss": float(outputs[-1][0]),
              "test_accuracy": test_accuracy([v.numpy() for v in model.weights], args.data_dir)}
    with open(result_path, "w") as f:
        json.dump(result, f)


def die_with_parent():
    """In the child before exec: SIGKILL when the launcher dies, however it dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def tail(path, lines=30):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def summarise(args, results):
    """The final figures from the tasks' result files."""
    if args.mode == "pss":
        r = results["chief:0"]
        info = [f"coordinator: {r['scheduled_steps']} scheduled steps of {args.batch_size // 2} "
                f"(workers ran {' + '.join(map(str, r['per_worker']))}), "
                f"last loss {r['last_loss']:.4f}"]
        return r["images"], r["seconds"], r["test_accuracy"], info
    rows = [results[f"worker:{i}"] for i in range(2)]
    if any(r["start"] is None for r in rows):
        raise RuntimeError("a worker finished before the end of its warm-up: raise --steps")
    first = min(rows, key=lambda r: r["start"][0])
    span = max(r["end"][0] for r in rows) - first["start"][0]
    images = (max(r["end"][1] for r in rows) - first["start"][1]) * rows[0][
        "images_per_global_step"]
    info = [f"worker {r['worker']}: {r['local_steps']} local steps, timed "
            f"{r['end'][0] - r['start'][0]:.2f} s, global step {r['start'][1]} -> {r['end'][1]}"
            for r in rows]
    chief = rows[0]
    if not chief.get("all_done", False):
        info.append("warning: the chief evaluated before every worker reported done")
    info.append(f"final global step {chief['global_step']}")
    return images, span, chief["test_accuracy"], info


def launch(args, argv):
    tasks = [("ps", 0), ("worker", 0), ("worker", 1)] + ([("chief", 0)] if args.mode == "pss"
                                                           else [])
    ports = iter(free_ports(len(tasks)))
    cluster = {}
    for job, _ in tasks:
        cluster.setdefault(job, []).append(f"127.0.0.1:{next(ports)}")
    finishers = ["chief:0"] if args.mode == "pss" else ["worker:0", "worker:1"]
    print(f"mode {args.mode}: " + ", ".join(f"{j} {a}" for j, a in cluster.items()), flush=True)
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)  # the tasks get the cluster on their command line
    tmp = tempfile.mkdtemp(prefix="tf_ps_baseline.")
    procs, logs = {}, {}
    status = 1

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)  # runs the finally below

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    try:
        for job, index in tasks:
            name = f"{job}:{index}"
            logs[name] = os.path.join(tmp, f"{job}-{index}.log")
            with open(logs[name], "w") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--task", name, "--cluster",
                     json.dumps(cluster), "--result_dir", tmp] + argv,
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=die_with_parent)
        deadline = time.time() + args.timeout
        problem = None
        while problem is None:
            codes = {n: p.poll() for n, p in procs.items()}
            failed = [n for n in finishers if codes[n] not in (None, 0)]
            gone = [n for n in procs if n not in finishers and codes[n] is not None]
            if failed:
                problem = f"{', '.join(failed)} failed (exit status {codes[failed[0]]})"
            elif gone:
                problem = f"{', '.join(gone)} exited by itself (exit status {codes[gone[0]]})"
            elif all(codes[n] == 0 for n in finishers):
                break
            elif time.time() > deadline:
                problem = f"timed out after {args.timeout} s"
            else:
                time.sleep(0.2)
        if problem is None:
            results = {}
            for name in finishers:
                with open(os.path.join(tmp, name.replace(":", "-") + ".json")) as f:
                    results[name] = json.load(f)
            images, seconds, accuracy, info = summarise(args, results)
            tf_version = results[finishers[0]]["tensorflow"]
            print(f"tf {tf_version}, 1 ps + 2 workers, global batch {args.batch_size}, "
                  f"{args.steps} steps of {args.batch_size} ({args.warmup} warm-up), lr {args.lr}")
            for line in info:
                print(line)
            print(f"timed {images} images in {seconds:.2f} s")
            line = {"images_per_sec": images / seconds, "test_accuracy": accuracy,
                    "mode": args.mode}
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(dict(line, images=images, seconds=seconds, tensorflow=tf_version,
                                   steps=args.steps, warmup=args.warmup), f, indent=1)
                    f.write("\n")
            print(f"images_per_sec {line['images_per_sec']:.1f} test_accuracy {accuracy:.4f} "
                  f"mode {args.mode}", flush=True)
            status = 0
        else:
            print(f"tf_ps_baseline.py: {problem}", file=sys.stderr)
            for name in procs:
                code = procs[name].poll()
                print(f"--- {name} ({'running' if code is None else f'exit status {code}'}), "
                      f"last lines of its log:\n"
                      f"{tail(logs[name])}", end="", file=sys.stderr)
    finally:
        for proc in procs.values():  # the ps (and pss workers) never exit by themselves
            if proc.poll() is None:
                proc.kill()
        for proc in procs.values():
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("async", "sync", "pss"), required=True)
    parser.add_argument("--steps", type=int, default=TRAIN_SIZE // 64,
                        help="global steps of --batch_size images, warm-up included (default: "
                             "one epoch); async and pss push 2 x 32 per global step")
    parser.add_argument("--warmup", type=int, default=20, help="untimed first global steps")
    parser.add_argument("--batch_size", type=int, default=64, help="GLOBAL batch size (even)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds before every task is killed and the run fails")
    parser.add_argument("--json", help="also write the final figures to this JSON file")
    parser.add_argument("--task", help=argparse.SUPPRESS)  # JOB:INDEX of a child task
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    parser.add_argument("--result_dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2 or args.batch_size < 2 or args.batch_size % 2:
        parser.error("--steps must be >= 2 and --batch_size even")
    if args.task is None:
        if not os.path.isfile(os.path.join(args.data_dir, "t10k-labels-idx1-ubyte.gz")):
            parser.error(f"no Fashion-MNIST IDX files in {args.data_dir}")
        return launch(args, sys.argv[1:])
    job, index = args.task.split(":")
    index, cluster = int(index), json.loads(args.cluster)
    result = os.path.join(args.result_dir, f"{job}-{index}.json")
    if job == "ps" or (job == "worker" and args.mode == "pss"):
        serve(cluster, job, index)
    elif job == "worker":
        tf1_worker(args, cluster, index, result)
    else:
        pss_chief(args, cluster, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
