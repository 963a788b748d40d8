#!/usr/bin/env python3
"""Reference updates for mwms::apply_gradient (include/mwms/optimizer.h): what TensorFlow's own
tf.compat.v1.train optimizers (GradientDescentOptimizer, MomentumOptimizer, AdamOptimizer) do to a
small float32 variable over a few steps of fixed gradients, written to
tests/data/ps/tf_optimizer_vectors.json.

The values come from TensorFlow's kernels (ResourceApplyGradientDescent, ResourceApplyMomentum,
ResourceApplyAdam, run by a tf.compat.v1 Session), never from a re-implementation. The JSON is
committed: the C++ unit test (tests/unit/kernels/optimizer_test.cc) reads it and never needs
TensorFlow. Regenerate it after changing the cases below (or for a new TF release):

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install 'tensorflow-cpu==2.21.*'
    /tmp/tfvenv/bin/python scripts/tf_optimizer_vectors.py [--out PATH]

Each case: {"name", "kind" ("sgd", "momentum", "adam"), "options" (the OptimizerOptions members
the kind uses, as given to TF), "var0", "grads" (one list per step), "steps": [{"var", "slots":
{slot name: values}}] after each step}. Every number is a float32 value written as the double
equal to it, so it reads back exactly.
"""
import argparse
import json
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

STEPS = 5
SIZE = 19  # not a multiple of 4 or 8: the C++ test also covers the vector loops' tails


def values(array):
    return [float(x) for x in np.asarray(array, dtype=np.float32)]


def inputs():
    """(var0, grads): fixed, varied magnitudes and signs, zeros, a tiny and a large gradient."""
    rng = np.random.RandomState(20240611)
    var0 = rng.uniform(-1.0, 1.0, SIZE).astype(np.float32)
    grads = rng.normal(0.0, 0.5, (STEPS, SIZE)).astype(np.float32)
    grads[:, 0] = 0.0                # a gradient that is always zero
    grads[1, 1] = 0.0                # one zero among others
    grads[:, 2] = 1e-6               # tiny: v underflows towards float32's subnormals
    grads[:, 3] = [1e3, -1e3, 1e3, -1e3, 1e3]  # large, alternating
    grads[2, 4] = -grads[1, 4]       # a sign change
    return var0, grads


CASES = [
    ("sgd", "sgd", {"learning_rate": 0.1}),
    ("sgd-small-lr", "sgd", {"learning_rate": 0.003}),
    ("momentum", "momentum", {"learning_rate": 0.05, "momentum": 0.9, "use_nesterov": False}),
    ("momentum-nesterov", "momentum",
     {"learning_rate": 0.05, "momentum": 0.9, "use_nesterov": True}),
    ("momentum-0.5", "momentum", {"learning_rate": 0.2, "momentum": 0.5, "use_nesterov": False}),
    ("adam-defaults", "adam",
     {"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
    ("adam-custom", "adam", {"learning_rate": 0.1, "beta1": 0.8, "beta2": 0.99, "epsilon": 1e-7}),
    ("adam-large-eps", "adam",
     {"learning_rate": 0.01, "beta1": 0.5, "beta2": 0.75, "epsilon": 0.1}),
]

SLOTS = {"sgd": [], "momentum": ["momentum"], "adam": ["m", "v"]}


def make_optimizer(kind, o):
    train = tf.compat.v1.train
    if kind == "sgd":
        return train.GradientDescentOptimizer(o["learning_rate"])
    if kind == "momentum":
        return train.MomentumOptimizer(o["learning_rate"], o["momentum"],
                                       use_nesterov=o["use_nesterov"])
    return train.AdamOptimizer(o["learning_rate"], o["beta1"], o["beta2"], o["epsilon"])


def run_case(name, kind, options, var0, grads):
    graph = tf.Graph()
    with graph.as_default():
        var = tf.compat.v1.get_variable("var", initializer=var0, dtype=tf.float32,
                                        use_resource=True)
        grad = tf.compat.v1.placeholder(tf.float32, shape=[SIZE])
        opt = make_optimizer(kind, options)
        train_op = opt.apply_gradients([(grad, var)])
        slots = {s: opt.get_slot(var, s) for s in SLOTS[kind]}
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            steps = []
            for g in grads:
                sess.run(train_op, feed_dict={grad: g})
                var_now, slots_now = sess.run([var, slots])
                steps.append({"var": values(var_now),
                              "slots": {s: values(v) for s, v in slots_now.items()}})
    return {"name": name, "kind": kind, "options": options, "var0": values(var0),
            "grads": [values(g) for g in grads], "steps": steps}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "tests", "data", "ps", "tf_optimizer_vectors.json")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=default_out)
    args = parser.parse_args()

    tf.compat.v1.disable_eager_execution()
    var0, grads = inputs()
    cases = [run_case(name, kind, options, var0, grads) for name, kind, options in CASES]
    doc = {"generator": "scripts/tf_optimizer_vectors.py", "tensorflow": tf.__version__,
           "steps": STEPS, "size": SIZE, "cases": cases}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    text = json.dumps(doc, indent=1)
    # One line per list of numbers: a step's values stay together and the file stays small.
    text = re.sub(r"\[\s*([-+0-9.e,\s]+?)\s*\]",
                  lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print("wrote %d cases to %s" % (len(cases), args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
