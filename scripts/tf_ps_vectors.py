#!/usr/bin/env python3
"""Conformance vectors for variable placement on parameter servers: where TensorFlow itself puts
each variable (and each partition of a partitioned variable), written to
tests/data/ps/tf_placement_vectors.json.

Every case builds a fresh TF 1 graph (tf.Graph, tf.compat.v1.get_variable) under
tf.compat.v1.train.replica_device_setter(ps_tasks=num_ps) with one of the partitioners
tf.compat.v1.fixed_size_partitioner / min_max_variable_partitioner (axis 0) or none, and records
for every variable op TF created: its name (op.name, "name/part_K" for a partition), the ps task
of its device, and the slice TF cut (_get_save_slice_info(): var_offset, var_shape; the whole
variable when it is not partitioned). The values come from TensorFlow's code: the variable store
(_call_partitioner, _iter_slices, the scalar exception), the partitioners, the device function
and, for "round_robin", TF's own _RoundRobinStrategy (replica_device_setter's default).

"greedy" is the one exception. GreedyLoadBalancingStrategy(num_ps, byte_size_load_fn) lived in
tf.contrib.training and is gone from TF 2, so the ps_strategy used here is this script's own
callable with contrib's rule (TF 1.15 source): the op goes to the least-loaded ps task so far
(numpy argmin: ties to the lowest index), whose load then grows by the op's bytes. The bytes are
read from the op's "shape" and "dtype" attributes (num_elements * dtype.size), which both
VariableV2 and VarHandleOp carry. TF still decides which ops the strategy sees, in which order
and with which shapes. (contrib's byte_size_load_fn itself measures op.outputs[0]: for a
VarHandleOp that is a scalar resource handle, tf.dtypes.resource.size == 0 in TF 2.21, so it
would load every resource variable as 0 bytes and put them all on ps 0.)

The script asserts that the strategy is called exactly once per variable op, in creation order
(each partition is its own VariableV2/VarHandleOp), for resource and reference variables alike.

The JSON is committed: the C++ unit test (tests/unit/strategy/ps_placement_test.cc) reads it and
never needs TensorFlow. Regenerate it after changing the cases below (or for a new TF release):

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install 'tensorflow-cpu==2.21.*'
    /tmp/tfvenv/bin/python scripts/tf_ps_vectors.py [--out PATH]

Layout: {"generator", "tensorflow", "header", "variable_lists", "placements": [...],
"partitions": [...]}.
Partitioners are {"kind": "none"}, {"kind": "fixed_size", "num_shards"} or
{"kind": "min_max", "max_partitions", "min_slice_size"}.
Each placement: {"label", "num_ps", "strategy" ("round_robin"|"greedy"), "use_resource",
"partitioner", "variables" (a key of "variable_lists": [[name, shape, dtype], ...]), "shards":
[[variable index, name, ps task, var_offset, var_shape], ...] in creation order}.
Each partition vector (one variable, no placement): {"label", "shape", "dtype", "partitioner",
"tf_raised", then "error_kind" and "error" (first 120 characters) when TF raised, else
"partitioned" (TF returned a PartitionedVariable), "num_partitions" and "rows_first_last" (axis-0
length of the first and the last slice; null for a scalar)}.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

VARIABLE_LISTS = {
    "mlp": [("dense/kernel", [784, 256], "float32"), ("dense/bias", [256], "float32"),
            ("dense_1/kernel", [256, 10], "float32"), ("dense_1/bias", [10], "float32")],
    "embed": [("emb", [1000, 64], "float32"), ("small", [7, 3], "float32"),
              ("one", [1], "float32"), ("scale", [], "float32"), ("global_step", [], "int64"),
              ("wide", [5, 5], "float64"), ("ids", [3], "int32")],
    "mixed": [("conv", [3, 3, 16, 8], "float32"), ("half", [9, 2], "float16"),
              ("bf", [33, 5], "bfloat16"), ("row", [1, 7], "float32"), ("odd", [13], "float64"),
              ("big", [4096, 128], "float32"), ("col", [6, 1], "int64")],
    "tiny": [("a", [2, 9], "float32"), ("b", [3], "float32"), ("c", [1, 1], "float32"),
             ("d", [4, 2], "int32"), ("e", [5], "float64"), ("f", [], "float32")],
}

PARTITIONERS = [
    {"kind": "none"},
    {"kind": "fixed_size", "num_shards": 1},
    {"kind": "fixed_size", "num_shards": 2},
    {"kind": "fixed_size", "num_shards": 3},
    {"kind": "fixed_size", "num_shards": 4},
    {"kind": "fixed_size", "num_shards": 5},
    {"kind": "min_max", "max_partitions": 1, "min_slice_size": 256 << 10},
    {"kind": "min_max", "max_partitions": 3, "min_slice_size": 256 << 10},
    {"kind": "min_max", "max_partitions": 2, "min_slice_size": 1024},
    {"kind": "min_max", "max_partitions": 4, "min_slice_size": 4096},
    {"kind": "min_max", "max_partitions": 8, "min_slice_size": 1024},
    {"kind": "min_max", "max_partitions": 16, "min_slice_size": 64},
    {"kind": "min_max", "max_partitions": 12, "min_slice_size": 1},
]

# Single-variable cases for the partitioners' corners and errors.
EDGE_SHAPES = [[], [0], [0, 4], [5, 0], [1], [2, 9], [7, 3], [1000, 64], [1 << 20, 128],
               [-1, 3], [4, -2]]
EDGE_DTYPES = ["float32", "float64", "float16"]
EDGE_PARTITIONERS = [
    {"kind": "none"},
    {"kind": "fixed_size", "num_shards": 0},
    {"kind": "fixed_size", "num_shards": -1},
    {"kind": "fixed_size", "num_shards": 1},
    {"kind": "fixed_size", "num_shards": 3},
    {"kind": "fixed_size", "num_shards": 100},
    {"kind": "min_max", "max_partitions": 0, "min_slice_size": 1},
    {"kind": "min_max", "max_partitions": -2, "min_slice_size": 1},
    {"kind": "min_max", "max_partitions": 4, "min_slice_size": 0},
    {"kind": "min_max", "max_partitions": 4, "min_slice_size": -5},
    {"kind": "min_max", "max_partitions": 4, "min_slice_size": 1},
    {"kind": "min_max", "max_partitions": 7, "min_slice_size": 3},
    {"kind": "min_max", "max_partitions": 1000, "min_slice_size": 1024},
    {"kind": "min_max", "max_partitions": 5000, "min_slice_size": 256 << 10},
]


def partitioner_label(p):
    if p["kind"] == "none":
        return "none"
    if p["kind"] == "fixed_size":
        return "fixed_size(%d)" % p["num_shards"]
    return "min_max(%d,%d)" % (p["max_partitions"], p["min_slice_size"])


def make_partitioner(tf, p):
    v1 = tf.compat.v1
    if p["kind"] == "none":
        return None
    if p["kind"] == "fixed_size":
        return v1.fixed_size_partitioner(p["num_shards"], axis=0)
    return v1.min_max_variable_partitioner(max_partitions=p["max_partitions"], axis=0,
                                           min_slice_size=p["min_slice_size"])


class GreedyByBytes:
    """contrib's GreedyLoadBalancingStrategy rule with a bytes load (see the module docstring)."""

    def __init__(self, tf, num_tasks):
        self._tf = tf
        self._loads = [0] * num_tasks

    def __call__(self, op):
        task = min(range(len(self._loads)), key=lambda i: (self._loads[i], i))
        shape = self._tf.TensorShape(op.get_attr("shape"))
        dtype = self._tf.as_dtype(op.get_attr("dtype"))
        self._loads[task] += shape.num_elements() * dtype.size
        return task


class Logged:
    """Forwards to a ps_strategy and records the ops it was asked about."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __call__(self, op):
        self.calls.append(op.name)
        return self.inner(op)


def ps_task_of(tf, device):
    spec = tf.DeviceSpec.from_string(device)
    assert spec.job == "ps", device
    return int(spec.task)


def slices_of(var):
    """[(variable op, var_offset, var_shape)] of what get_variable returned."""
    parts = list(var) if hasattr(var, "_get_partitions") else [var]
    out = []
    for part in parts:
        info = part._get_save_slice_info()
        if info is None:
            shape = part.shape.as_list()
            out.append((part.op, [0] * len(shape), shape))
        else:
            out.append((part.op, list(info.var_offset), list(info.var_shape)))
    return out


def placement(tf, num_ps, strategy, use_resource, partitioner, variables):
    from tensorflow.python.training import device_setter
    v1 = tf.compat.v1
    if strategy == "round_robin":
        chooser = Logged(device_setter._RoundRobinStrategy(num_ps))
    else:
        chooser = Logged(GreedyByBytes(tf, num_ps))
    shards = []
    created = []
    with tf.Graph().as_default():
        with v1.device(v1.train.replica_device_setter(ps_tasks=num_ps, ps_strategy=chooser)):
            for index, (name, shape, dtype) in enumerate(variables):
                var = v1.get_variable(name, shape=shape, dtype=tf.as_dtype(dtype),
                                      initializer=v1.zeros_initializer(),
                                      partitioner=make_partitioner(tf, partitioner),
                                      use_resource=use_resource)
                for op, offset, shape_of_slice in slices_of(var):
                    created.append(op.name)
                    shards.append([index, op.name, ps_task_of(tf, op.device), offset,
                                   shape_of_slice])
    assert chooser.calls == created, (chooser.calls, created)
    return shards


def placements(tf):
    out = []
    for list_name, variables in VARIABLE_LISTS.items():
        for p in PARTITIONERS:
            for num_ps in (1, 2, 3):
                # With one ps task every strategy answers 0: round_robin only.
                for strategy in ("round_robin", "greedy")[:1 if num_ps == 1 else 2]:
                    # Resource variables (TF 2's default) everywhere; reference variables
                    # (VariableV2) for three ps tasks, to show both are placed alike.
                    for use_resource in ((True, False) if num_ps == 3 else (True,)):
                        label = "%s/%s/ps%d/%s%s" % (list_name, partitioner_label(p), num_ps,
                                                     strategy, "" if use_resource else "/ref")
                        out.append({
                            "label": label, "num_ps": num_ps, "strategy": strategy,
                            "use_resource": use_resource, "partitioner": p,
                            "variables": list_name,
                            "shards": placement(tf, num_ps, strategy, use_resource, p,
                                                variables)})
    return out


def partition_case(tf, shape, dtype, p):
    v1 = tf.compat.v1
    try:
        with tf.Graph().as_default():
            var = v1.get_variable("v", shape=shape, dtype=tf.as_dtype(dtype),
                                  initializer=v1.zeros_initializer(),
                                  partitioner=make_partitioner(tf, p))
            rows = [s[2][0] if s[2] else None for s in slices_of(var)]
            return {"tf_raised": False, "partitioned": hasattr(var, "_get_partitions"),
                    "num_partitions": len(rows), "rows_first_last": [rows[0], rows[-1]]}
    except Exception as exc:  # ValueError, ZeroDivisionError, ...
        return {"tf_raised": True, "error_kind": type(exc).__name__, "error": str(exc)[:120]}


def partitions(tf):
    out = []
    for shape in EDGE_SHAPES:
        for dtype in EDGE_DTYPES:
            for p in EDGE_PARTITIONERS:
                label = "%s/%s/%s" % (shape, dtype, partitioner_label(p))
                out.append(dict(label=label, shape=shape, dtype=dtype, partitioner=p,
                                **partition_case(tf, shape, dtype, p)))
    return out


def write(doc, path):
    """One placement or partition vector per line: diffable and well under 1 MB."""
    with open(path, "w") as f:
        f.write("{\n")
        for key in ("generator", "tensorflow", "header", "variable_lists"):
            f.write(" %s: %s,\n" % (json.dumps(key), json.dumps(doc[key])))
        for i, key in enumerate(("placements", "partitions")):
            f.write(" %s: [\n" % json.dumps(key))
            rows = [json.dumps(v, sort_keys=True, separators=(",", ":")) for v in doc[key]]
            f.write(",\n".join("  " + r for r in rows))
            f.write("\n ]%s\n" % ("," if i == 0 else ""))
        f.write("}\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "tests", "data", "ps", "tf_placement_vectors.json")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=default_out)
    args = parser.parse_args()
    import tensorflow as tf

    header = ("Generated by TensorFlow %s itself (tf.compat.v1 graph mode): names, slices and "
              "ps tasks from get_variable under replica_device_setter; round_robin is TF's "
              "_RoundRobinStrategy. greedy: GreedyLoadBalancingStrategy is not in TF 2, so its "
              "rule (least-loaded ps, ties lowest index, load += num_elements * dtype.size of "
              "the op's shape/dtype attrs) is the generator's own callable after contrib's "
              "TF 1.15 source; TF supplies the ops, their order and shapes. "
              "tf.dtypes.resource.size = %d." % (tf.__version__, tf.dtypes.resource.size))
    doc = {"generator": "scripts/tf_ps_vectors.py", "tensorflow": tf.__version__,
           "header": header, "variable_lists": VARIABLE_LISTS, "placements": placements(tf), "partitions": partitions(tf)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write(doc, args.out)
    raised = sum(v["tf_raised"] for v in doc["partitions"])
    shards = sum(len(v["shards"]) for v in doc["placements"])
    print("%d placements (%d shards), %d partition vectors (%d raise in TF %s) -> %s"
          % (len(doc["placements"]), shards, len(doc["partitions"]), raised, tf.__version__,
             os.path.normpath(args.out)))


if __name__ == "__main__":
    sys.exit(main())
