#!/usr/bin/env python3
"""Conformance vectors for TF_CONFIG: what TensorFlow itself derives from each of a few hundred
TF_CONFIG values, written to tests/data/tfconfig/tf_semantics_vectors.json.

The values come from TensorFlow's own code, never from a re-implementation:
TFConfigClusterResolver (task_type, task_id, rpc_layer, cluster_spec) and multi_worker_util
(id_in_cluster, worker_count, is_chief, collective_leader, called through _validate_cluster_spec),
in the order CollectiveAllReduceExtended._initialize_strategy calls them: an empty cluster spec
means local training (world of one, chief, id 0); otherwise task type and id are required and
id_in_cluster, worker_count (0 -> ValueError), is_chief and collective_leader follow.

The JSON is committed: the C++ unit test (tests/unit/bootstrap/tf_semantics_test.cc) reads it and
never needs TensorFlow. Regenerate it after changing the cases below (or for a new TF release):

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install 'tensorflow-cpu==2.21.*'
    /tmp/tfvenv/bin/python scripts/tf_semantics_vectors.py [--out PATH]

Each vector: {"label", "tf_config" (the exact text), "tf_raised" (bool), "error_kind"
(exception class name) and "error" (its first 200 characters) when TF raised, else "values":
{task_type, task_id, rpc_layer, cluster (as_dict), local, id_in_cluster, num_workers, is_chief,
collective_leader}}.
"""
import argparse
import itertools
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def addresses(job, count):
    return ["%s%d.example:2222" % (job, i) for i in range(count)]


def cluster_grid():
    """(label, cluster dict) for every combination of job sizes, "[]" meaning an empty list."""
    sizes = {
        "chief": [None, 0, 1, 2],
        "worker": [None, 0, 1, 3],
        "ps": [None, 1],
        "evaluator": [None, 1],
    }
    jobs = list(sizes)
    for combo in itertools.product(*(sizes[j] for j in jobs)):
        cluster = {}
        parts = []
        for job, n in zip(jobs, combo):
            if n is None:
                continue
            cluster[job] = addresses(job, n)
            parts.append("%s%d" % (job, n))
        yield "grid:" + ("+".join(parts) or "empty"), cluster


GRID_TASKS = [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("worker", 3),
              ("ps", 0), ("evaluator", 0), ("evaluator", 1)]


def special_cases():
    w2 = {"worker": addresses("worker", 2)}
    cw = {"chief": addresses("chief", 1), "worker": addresses("worker", 2)}
    d = json.dumps
    t = lambda typ, idx: {"type": typ, "index": idx}
    yield "empty-object", "{}"
    yield "empty-cluster", d({"cluster": {}})
    yield "empty-cluster-worker3", d({"cluster": {}, "task": t("worker", 3)})
    yield "empty-cluster-chief0", d({"cluster": {}, "task": t("chief", 0)})
    yield "empty-cluster-evaluator0", d({"cluster": {}, "task": t("evaluator", 0)})
    yield "empty-cluster-rpc", d({"cluster": {}, "rpc_layer": "grpc"})
    yield "no-cluster-task-worker0", d({"task": t("worker", 0)})
    yield "no-cluster-environment", d({"environment": "cloud"})
    yield "only-empty-jobs-worker0", d({"cluster": {"worker": []}, "task": t("worker", 0)})
    yield "only-empty-ps-worker0", d({"cluster": {"ps": []}, "task": t("worker", 0)})
    yield "only-empty-jobs-no-task", d({"cluster": {"worker": [], "ps": []}})
    yield "no-task-one-worker", d({"cluster": {"worker": ["w0.example:1"]}})
    yield "no-task-two-workers", d({"cluster": w2})
    yield "task-empty-object", d({"cluster": w2, "task": {}})
    yield "task-null", d({"cluster": w2, "task": None})
    yield "task-no-index-one-worker", d({"cluster": {"worker": ["w0.example:1"]},
                                         "task": {"type": "worker"}})
    yield "task-no-index", d({"cluster": w2, "task": {"type": "worker"}})
    yield "task-no-type", d({"cluster": w2, "task": {"index": 0}})
    for label, index in [("string", "1"), ("float", 1.0), ("string-zero", "0"),
                         ("null", None), ("word", "one"), ("list", [1]), ("too-large", 5)]:
        yield "index-" + label, d({"cluster": w2, "task": t("worker", index)})
    # TF's int() accepts these; libmwms is deliberately stricter (see the unit test).
    for label, index in [("fraction", 1.5), ("bool", True), ("plus", "+1"), ("spaces", " 1 "),
                         ("underscore", "0_1"), ("negative", -1), ("negative-string", "-1")]:
        yield "lenient-index-" + label, d({"cluster": w2, "task": t("worker", index)})
    yield "rpc-grpc", d({"cluster": w2, "task": t("worker", 1), "rpc_layer": "grpc"})
    yield "rpc-grpc+verbs", d({"cluster": cw, "task": t("chief", 0), "rpc_layer": "grpc+verbs"})
    for env in ["google", "cloud", "local", ""]:
        yield "environment-" + (env or "blank"), d(
            {"cluster": cw, "task": t("worker", 1), "environment": env})
    yield "extra-task-fields", d({"cluster": cw, "task": {"type": "worker", "index": 0,
                                                          "trial": "3", "cloud": "x"}})
    yield "extra-top-keys", d({"cluster": cw, "task": t("chief", 0), "session_master": "",
                               "job": {"x": 1}})
    yield "dict-jobs-dense", d({"cluster": {"worker": {"0": "w0.example:1", "1": "w1.example:1"}},
                                "task": t("worker", 1)})
    yield "dict-jobs-unordered", d({"cluster": {"chief": {"0": "c0.example:1"},
                                                "worker": {"1": "w1.example:1",
                                                           "0": "w0.example:1"}},
                                    "task": t("worker", 1)})
    yield "dict-jobs-sparse-worker0", d({"cluster": {"worker": {"1": "h.example:1"}},
                                         "task": t("worker", 0)})
    yield "dict-jobs-sparse-worker1", d({"cluster": {"worker": {"1": "h.example:1"}},
                                         "task": t("worker", 1)})
    yield "dict-jobs-bad-key", d({"cluster": {"worker": {"a": "h.example:1"}},
                                  "task": t("worker", 0)})
    yield "job-master", d({"cluster": {"master": ["m.example:1"], "worker": ["w.example:1"]},
                           "task": t("worker", 0)})
    yield "task-master", d({"cluster": {"master": ["m.example:1"]}, "task": t("master", 0)})
    yield "job-unknown", d({"cluster": {"trainer": ["m.example:1"]}, "task": t("trainer", 0)})
    yield "task-unknown-type", d({"cluster": w2, "task": t("trainer", 0)})
    yield "empty-cluster-task-master", d({"cluster": {}, "task": t("master", 0)})
    yield "empty-cluster-task-ps", d({"cluster": {}, "task": t("ps", 0)})
    yield "cluster-null", d({"cluster": None, "task": t("worker", 0)})
    yield "cluster-list", d({"cluster": ["w.example:1"], "task": t("worker", 0)})
    yield "cluster-string", d({"cluster": "w.example:1", "task": t("worker", 0)})
    yield "job-string", d({"cluster": {"worker": "w.example:1"}, "task": t("worker", 0)})
    yield "job-null", d({"cluster": {"worker": None}, "task": t("worker", 0)})
    yield "address-number", d({"cluster": {"worker": [2222]}, "task": t("worker", 0)})
    yield "address-null", d({"cluster": {"worker": [None]}, "task": t("worker", 0)})
    yield "sparse-cluster-key", d({"sparseCluster": {"worker": {"0": "w.example:1"}},
                                   "task": t("worker", 0)})
    yield "top-level-list", "[]"
    yield "top-level-number", "5"
    yield "top-level-string", '"worker"'
    yield "malformed-json", '{"cluster": {"worker": ["a:1"]}, "task": '
    yield "big-number-index", '{"cluster": {"worker": ["w.example:1"]}, ' \
                              '"task": {"type": "worker", "index": 1e400}}'
    # Deliberate libmwms checks: TF accepts any string as an address.
    for label, addr in [("no-port", "w1.example"), ("port0", "w1.example:0"),
                        ("port-too-big", "w1.example:70000"), ("empty", ""),
                        ("scheme", "grpc://w1.example:1"), ("space", "w1.example :1"),
                        ("ipv6-unbracketed", "fe80::1:2222")]:
        yield "address-" + label, d({"cluster": {"worker": ["w0.example:1", addr]},
                                     "task": t("worker", 0)})
    yield "address-ipv6", d({"cluster": {"worker": ["[::1]:2222", "[::1]:2223"]},
                             "task": t("worker", 1)})
    yield "address-duplicate", d({"cluster": {"worker": ["w.example:1", "w.example:1"]},
                                  "task": t("worker", 0)})
    yield "address-duplicate-case", d({"cluster": {"chief": ["W.example:1"],
                                                   "worker": ["w.example:1"]},
                                       "task": t("worker", 0)})
    yield "address-loopback-mix", d({"cluster": {"worker": ["localhost:1", "w.example:1"]},
                                     "task": t("worker", 0)})
    yield "address-loopback-all", d({"cluster": {"chief": ["localhost:1"],
                                                 "worker": ["127.0.0.1:2", "localhost:3"]},
                                     "task": t("worker", 1)})
    yield "evaluator-outside-cluster", d({"cluster": cw, "task": t("evaluator", 0)})
    yield "chief-empty-with-workers", d({"cluster": {"chief": [], "worker": addresses("w", 2)},
                                         "task": t("worker", 0)})
    yield "kubeflow-like", d({"cluster": {"chief": ["job-chief-0.ns.svc:2222"],
                                          "worker": ["job-worker-0.ns.svc:2222",
                                                     "job-worker-1.ns.svc:2222"],
                                          "evaluator": ["job-evaluator-0.ns.svc:2222"]},
                              "task": {"type": "evaluator", "index": 0},
                              "environment": "cloud"})


def cases():
    for label, cluster in cluster_grid():
        for task_type, index in GRID_TASKS:
            yield ("%s/%s%d" % (label, task_type, index),
                   json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}}))
    yield from special_cases()


def error_of(exc):
    return {"tf_raised": True, "error_kind": type(exc).__name__, "error": str(exc)[:200]}


def jsonable_cluster(spec):
    out = {}
    for job, tasks in spec.as_dict().items():
        out[job] = {str(k): v for k, v in tasks.items()} if isinstance(tasks, dict) else tasks
    return out


def tf_values(text):
    """What TensorFlow derives from one TF_CONFIG text (os.environ is how TF reads it)."""
    from tensorflow.python.distribute import multi_worker_util as mwu
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver

    os.environ["TF_CONFIG"] = text
    resolver = TFConfigClusterResolver()
    try:
        spec = resolver.cluster_spec()
        v = {"cluster": jsonable_cluster(spec), "rpc_layer": resolver.rpc_layer}
        if not spec.as_dict():
            # CollectiveAllReduceExtended._initialize_local: the task is never consulted.
            v.update(local=True, task_type=None, task_id=None, id_in_cluster=0, num_workers=1,
                     is_chief=True, collective_leader="")
            return {"tf_raised": False, "values": v}
        spec = mwu.normalize_cluster_spec(spec)
        task_type, task_id = resolver.task_type, resolver.task_id
        if task_type is None or task_id is None:
            raise ValueError("When `cluster_spec` is given, you must also specify `task_type` "
                             "and `task_id`.")
        v.update(local=False, task_type=task_type, task_id=task_id)
        v["id_in_cluster"] = mwu.id_in_cluster(spec, task_type, task_id)
        v["num_workers"] = mwu.worker_count(spec, task_type)
        if not v["num_workers"]:
            raise ValueError("No `worker`, `chief` or `evaluator` tasks can be found in "
                             "`cluster_spec`.")
        v["is_chief"] = mwu.is_chief(spec, task_type, task_id)
        v["collective_leader"] = mwu.collective_leader(spec, task_type, task_id)
        return {"tf_raised": False, "values": v}
    except Exception as exc:  # TF raises ValueError, TypeError, KeyError, json errors...
        return error_of(exc)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "tests", "data", "tfconfig", "tf_semantics_vectors.json")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=default_out)
    args = parser.parse_args()
    import tensorflow as tf

    vectors = []
    seen = set()
    for label, text in cases():
        assert label not in seen, label
        seen.add(label)
        vectors.append(dict(label=label, tf_config=text, **tf_values(text)))
    doc = {"generator": "scripts/tf_semantics_vectors.py", "tensorflow": tf.__version__,
           "vectors": vectors}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    raised = sum(v["tf_raised"] for v in vectors)
    print("%d vectors (%d raise in TF %s) -> %s" % (len(vectors), raised, tf.__version__,
                                                     os.path.normpath(args.out)))


if __name__ == "__main__":
    sys.exit(main())
