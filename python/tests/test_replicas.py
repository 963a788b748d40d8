"""Local replicas from Python on a world of one worker (MultiWorkerMirroredStrategy.run and
ReplicaContext, Note [python replicas]): exact values, errors that name the replica, misuse.
The multi-worker case is test_multiprocess.py::test_local_replicas_on_two_workers."""
from __future__ import annotations

import threading
import time
import traceback

import numpy as np
import pytest

import mwms


@pytest.fixture
def strategy3():
    s = mwms.MultiWorkerMirroredStrategy(mwms.resolve("{}"), local_replicas=3,
                                         timeout_seconds=20, bytes_per_pack=4096)
    yield s
    s.finalize()


def test_collectives_across_three_replicas(strategy3):
    s = strategy3
    assert (s.num_replicas_in_sync, s.num_local_replicas, s.num_workers) == (3, 3, 1)
    assert mwms.get_replica_context() is None  # outside run()

    def step(scale, offset=0):
        ctx = mwms.get_replica_context()
        assert isinstance(ctx, mwms.ReplicaContext)
        i = ctx.local_replica_id
        assert ctx.replica_id_in_sync_group == i and ctx.num_replicas_in_sync == 3
        assert ctx.num_local_replicas == 3
        x = np.full(3000, scale * (i + 1), dtype=np.float32)  # several buckets of 4096 bytes
        assert ctx.all_reduce("sum", x) is x
        np.testing.assert_array_equal(x, 6 * scale)
        y = [np.full(5, float(i), dtype=np.float64), np.arange(4, dtype=np.int64) * (i + 1)]
        ctx.all_reduce(mwms.ReduceOp.MAX, y)
        np.testing.assert_array_equal(y[0], 2.0)
        np.testing.assert_array_equal(y[1], np.arange(4) * 3)
        m = (np.full(7, 3.0 * i, dtype=np.float32),)
        ctx.all_reduce("mean", m)  # (0 + 3 + 6) / 3
        np.testing.assert_array_equal(m[0], 3.0)
        v = np.full(4, 10.0 + i, dtype=np.float32)  # replica 0 of the chief holds 10
        ctx.broadcast_variables(v)
        np.testing.assert_array_equal(v, 10.0)
        return i + offset, ctx.batch_shard(10), threading.get_ident()

    out = s.run(step, args=(2.0,), kwargs={"offset": 100})
    assert isinstance(out, tuple) and len(out) == 3
    assert [o[0] for o in out] == [100, 101, 102]  # local-replica order
    assert [o[1] for o in out] == [slice(0, 4), slice(4, 7), slice(7, 10)]
    assert out[0][2] == threading.get_ident()  # replica 0 runs on the calling thread
    assert len({o[2] for o in out}) == 3
    assert s.experimental_local_results(out) == out
    assert s.batch_shard(10) == slice(0, 10)  # the union of this worker's replicas' rows
    # reduce of a per-replica result: combined locally, then across workers.
    assert s.reduce("sum", [1.0, 2.0, 4.0]) == 7.0
    assert s.reduce("mean", (1.0, 2.0, 6.0)) == 3.0
    assert s.reduce("max", [1.0, 5.0, 4.0]) == 5.0
    assert s.reduce("min", [1.0, 5.0, -4.0]) == -4.0
    assert s.reduce("prod", [2.0, 5.0, 3.0]) == 30.0
    assert s.reduce("sum", 2.5) == 2.5  # one number per worker
    with pytest.raises(mwms.InvalidArgument, match="one per local replica"):
        s.reduce("sum", [1.0, 2.0])


def test_overlapped_step_across_replicas(strategy3):
    def step():
        ctx = mwms.get_replica_context()
        i = ctx.local_replica_id
        grads = [np.full(2000, i + 1.0, dtype=np.float32), np.full(3, 10.0 * i, dtype=np.float32),
                 np.full(1500, -1.0 * i, dtype=np.float64)]
        ctx.begin_gradient_sync(grads)
        for j in (2, 1, 0):  # backprop order: the last layer is final first
            ctx.gradient_ready(j)
        ctx.finish_gradient_sync()
        return [g.copy() for g in grads]

    for got in strategy3.run(step):
        np.testing.assert_array_equal(got[0], 6.0)
        np.testing.assert_array_equal(got[1], 30.0)
        np.testing.assert_array_equal(got[2], -3.0)


def test_a_replica_exception_is_raised_with_its_traceback(strategy3):
    others = {}

    def failing_step():
        ctx = mwms.get_replica_context()
        if ctx.local_replica_id == 1:
            time.sleep(0.05)  # the others are waiting in the collective by then
            raise ZeroDivisionError("replica one divided by zero")
        try:
            ctx.all_reduce("sum", np.ones(4, dtype=np.float32))
        except mwms.ReplicaError as e:
            others[ctx.local_replica_id] = str(e)
            raise

    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError, match="replica one divided by zero") as info:
        strategy3.run(failing_step)
    assert time.monotonic() - t0 < 10  # nobody waited for the deadline (20 s)
    assert "failing_step" in "".join(traceback.format_tb(info.value.__traceback__))
    assert sorted(others) == [0, 2]
    for what in others.values():
        assert "local replica 1" in what and "ZeroDivisionError" in what
    # The failure was local: the strategy goes on.
    def step():
        x = np.full(3, mwms.get_replica_context().local_replica_id, dtype=np.float32)
        mwms.get_replica_context().all_reduce("sum", x)
        return float(x[0])
    assert strategy3.run(step) == (3.0, 3.0, 3.0)


def test_misuse_is_named(strategy3):
    kept = []

    def keep():
        kept.append(mwms.get_replica_context())

    strategy3.run(keep)
    with pytest.raises(mwms.InvalidUsage, match="has returned"):
        kept[0].all_reduce("sum", np.ones(2, dtype=np.float32))
    assert sorted(c.local_replica_id for c in kept) == [0, 1, 2]  # the plain fields still read

    def from_another_thread():
        ctx = mwms.get_replica_context()
        errors = []
        t = threading.Thread(target=lambda: errors.append(_call(ctx)))
        t.start()
        t.join()
        assert errors and "another thread" in errors[0], errors
        ctx.all_reduce("sum", np.ones(2, dtype=np.float32))  # its own thread: fine

    strategy3.run(from_another_thread)

    def early_return():
        ctx = mwms.get_replica_context()
        if ctx.local_replica_id == 2:
            return
        ctx.all_reduce("sum", np.ones(2, dtype=np.float32))

    with pytest.raises(mwms.InvalidUsage, match="returned from its function"):
        strategy3.run(early_return)

    def nested():
        if mwms.get_replica_context().local_replica_id == 0:
            strategy3.run(lambda: None)

    with pytest.raises(mwms.InvalidUsage, match="inside run"):
        strategy3.run(nested)

    def different_shapes():
        ctx = mwms.get_replica_context()
        ctx.all_reduce("sum", np.ones(4 + ctx.local_replica_id, dtype=np.float32))

    with pytest.raises(mwms.InvalidArgument, match="replica"):
        strategy3.run(different_shapes)

    def not_an_array():
        mwms.get_replica_context().all_reduce("sum", [np.ones(2, dtype=np.float32), "x"])

    with pytest.raises(TypeError, match=r"value\[1\]"):
        strategy3.run(not_an_array)
    with pytest.raises(TypeError, match="kwargs"):
        strategy3.run(keep, kwargs=[1])

    def strategy_collective_inside():  # per worker: not for the replica threads
        if mwms.get_replica_context().local_replica_id == 0:
            strategy3.all_reduce_gradients([np.ones(2, dtype=np.float32)])

    with pytest.raises(mwms.InvalidUsage, match="inside run"):
        strategy3.run(strategy_collective_inside)
    with pytest.raises(TypeError, match=r"value\[1\]"):
        strategy3.reduce("sum", (1.0, "b", 2.0))
    with pytest.raises(TypeError, match="'value'"):
        strategy3.reduce("sum", "x")


def _call(ctx):
    try:
        ctx.all_reduce("sum", np.ones(2, dtype=np.float32))
    except mwms.InvalidUsage as e:
        return str(e)
    return "no error"


def test_one_replica_returns_its_value_and_k_is_checked():
    s = mwms.MultiWorkerMirroredStrategy(mwms.resolve("{}"), timeout_seconds=20)
    try:
        def step(a):
            ctx = mwms.get_replica_context()
            x = np.full(3, a, dtype=np.float32)
            ctx.all_reduce("sum", x)
            return (ctx.local_replica_id, ctx.num_local_replicas, float(x[0]))
        assert s.run(step, (4.0,)) == (0, 1, 4.0)  # the value itself, as TF's one replica
        assert s.experimental_local_results(5) == (5,)
    finally:
        s.finalize()
    for k in (0, 65):
        with pytest.raises(mwms.InvalidArgument, match="local_replicas"):
            mwms.MultiWorkerMirroredStrategy(mwms.resolve("{}"), local_replicas=k)


FIRST_RUN = """
import sys, numpy as np, mwms
assert "threading" not in sys.modules, "the race needs threading's first import in a collective"
s = mwms.MultiWorkerMirroredStrategy(mwms.resolve("{}"), local_replicas=8, timeout_seconds=20)
models = [[np.full(4, float(i), np.float32)] for i in range(8)]
def init():
    ctx = mwms.get_replica_context()
    ctx.broadcast_variables(models[ctx.local_replica_id])
s.run(init)
assert all((m[0] == 0).all() for m in models)
print("ok")
"""


def test_a_fresh_process_whose_first_call_is_a_replica_collective():
    """Note [python statics]: the first collective of 8 replicas at once, in a process that has
    not imported threading, deadlocked in 13 of 20 runs when a function-local static imported it
    (one thread waited on the static's guard holding the GIL). 5 fresh processes."""
    import subprocess
    import sys
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", FIRST_RUN], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
