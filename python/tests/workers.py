"""Worker side of the multi-process tests: `python workers.py SCENARIO`, started by conftest.Job
with TF_CONFIG and MWMS_LISTEN_FD. Each scenario asserts exact values itself (exit status 0 means
every assertion held) and prints `RECORD {json}` lines for the test to check.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings

import numpy as np

import mwms


def record(kind: str, **fields) -> None:
    print("RECORD " + json.dumps({"kind": kind, **fields}), flush=True)


def error_fields(e: mwms.Error) -> dict:
    return {"type": type(e).__name__, "what": str(e), "message": e.message, **e.context}


def dtypes():
    """(name, numpy dtype) of every dtype libmwms reduces; bfloat16 when ml_dtypes is there."""
    out = [("float32", np.float32), ("float64", np.float64), ("float16", np.float16),
           ("int32", np.int32), ("int64", np.int64)]
    try:
        import ml_dtypes
        out.append(("bfloat16", ml_dtypes.bfloat16))
    except ImportError:
        pass
    return out


def collectives() -> None:
    """Every collective on every dtype, with values whose results are exact in that dtype."""
    comm = mwms.Communicator(timeout_seconds=60)
    r, n = comm.rank, comm.world_size
    assert (r, n) == (int(json.loads(os.environ["TF_CONFIG"])["task"]["index"]), 2)
    checked = []
    for name, dt in dtypes():
        for count in (0, 1, 7, 1000, 300_000):  # 300k elements: the bandwidth algorithms
            # Small integers (< 2^7): sums, products, means of 2 ranks exact even in bfloat16.
            base = (np.arange(count) % 5).astype(np.float64)
            mine = (base + r).astype(dt)
            x = mine.copy()
            comm.all_reduce(x)  # default op: sum
            np.testing.assert_array_equal(x.astype(np.float64), 2 * base + 1)
            x = mine.copy()
            comm.all_reduce(x, mwms.ReduceOp.MAX)
            np.testing.assert_array_equal(x.astype(np.float64), base + 1)
            x = mine.copy()
            comm.all_reduce(x, "min")
            np.testing.assert_array_equal(x.astype(np.float64), base)
            x = mine.copy()
            comm.all_reduce(x, "prod")
            np.testing.assert_array_equal(x.astype(np.float64), base * (base + 1))
            x = (2 * base + 2 * r).astype(dt)  # mean of 2b and 2b + 2 is 2b + 1: exact
            comm.all_reduce(x, "mean")
            np.testing.assert_array_equal(x.astype(np.float64), 2 * base + 1)
            # all_gather: rank r's block at offset r * count.
            send = (base + 10 * r).astype(dt)
            recv = np.full(n * count, -1, dtype=dt)
            comm.all_gather(send, recv)
            np.testing.assert_array_equal(recv.astype(np.float64),
                                          np.concatenate([base + 10 * k for k in range(n)]))
            # reduce_scatter: block r of the sum.
            send = np.concatenate([base + k + r for k in range(n)]).astype(dt)
            recv = np.full(count, -1, dtype=dt)
            comm.reduce_scatter(send, recv, "sum")
            np.testing.assert_array_equal(recv.astype(np.float64), 2 * base + 2 * r + 1)
            # broadcast from rank 1.
            x = (base + 3 * r).astype(dt)
            comm.broadcast(x, root=1)
            np.testing.assert_array_equal(x.astype(np.float64), base + 3)
        checked.append(name)
    # In place, without a copy: a contiguous slice of a bigger array is reduced in its base, and
    # a multi-dimensional array is reduced whole.
    big = np.zeros(10, dtype=np.float32)
    big[2:6] = r + 1
    comm.all_reduce(big[2:6])
    np.testing.assert_array_equal(big, [0, 0, 3, 3, 3, 3, 0, 0, 0, 0])
    m = np.full((3, 4), r + 1, dtype=np.int64)
    comm.all_reduce(m)
    assert (m == 3).all() and m.shape == (3, 4)
    # Not NumPy: an object that exports DLPack only (as a PyTorch CPU tensor does), and a plain
    # buffer-protocol object (a memoryview of a bytearray). Each is reduced in its own memory.

    class DLPackOnly:
        def __init__(self, array):
            self._array = array

        def __dlpack__(self, **kwargs):
            return self._array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._array.__dlpack_device__()

    under = np.full(1000, r + 1, dtype=np.float32)
    exporter = DLPackOnly(under)
    assert not hasattr(exporter, "__array_interface__")
    comm.all_reduce(exporter)
    assert (under == 3).all()
    raw = bytearray(np.full(16, r + 1, dtype=np.float32).tobytes())
    comm.all_reduce(memoryview(raw).cast("B").cast("f"))
    np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.float32), np.full(16, 3))
    # Asynchronous forms: Work.test() / wait().
    a = np.full(1000, r + 1, dtype=np.float32)
    b = np.full(5, r, dtype=np.int32)
    w1 = comm.all_reduce_async(a)
    w2 = comm.broadcast_async(b, root=0)
    w3 = comm.barrier_async()
    w1.wait()
    w2.wait(timeout_seconds=30)
    w3.wait()
    assert w1.test() and w2.test() and w3.test()
    assert (a == 3).all() and (b == 0).all()
    g = np.empty(2 * 3, dtype=np.float64)
    w = comm.all_gather_async(np.full(3, r + 0.5), g)
    s = np.empty(2, dtype=np.float64)
    w_rs = comm.reduce_scatter_async(np.arange(4, dtype=np.float64) + r, s, "max")
    w.wait()
    w_rs.wait()
    np.testing.assert_array_equal(g, [0.5] * 3 + [1.5] * 3)
    np.testing.assert_array_equal(s, np.arange(4)[2 * r:2 * r + 2] + 1)
    # The GIL is released while a collective blocks: another thread runs meanwhile (rank 1
    # arrives 0.5 s late, so rank 0 waits in the all_reduce).
    ticks = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    if r == 1:
        time.sleep(0.5)
    late = np.full(3, r + 1, dtype=np.int64)
    w = comm.all_reduce_async(late)
    if r == 0:  # rank 1 is 0.5 s late: a Work.wait with a shorter timeout raises
        try:
            w.wait(timeout_seconds=0.05)
            raise AssertionError("Work.wait(0.05) did not time out")
        except mwms.TimeoutError as e:
            assert "Work::wait" in str(e) and isinstance(e, TimeoutError)
        assert not w.test()
    before = ticks[0]
    x = np.ones(4, dtype=np.float32)
    comm.all_reduce(x)
    during = ticks[0] - before
    stop.set()
    t.join()
    w.wait()
    assert (late == 3).all() and (x == 2).all()
    if r == 0:
        assert during >= 30, f"only {during} ticks while blocked: the GIL was held"
    comm.barrier()
    seq = comm.seq
    comm.finalize()
    record("collectives", rank=r, dtypes=checked, seq=seq)
    # After finalize every collective raises InvalidUsage.
    try:
        comm.barrier()
        raise AssertionError("barrier after finalize did not raise")
    except mwms.InvalidUsage as e:
        assert "finalized" in str(e)


def peer_killed() -> None:
    """Rank 1 dies (SIGKILL) after one collective; rank 0's next collective names it."""
    comm = mwms.Communicator(timeout_seconds=30)
    x = np.ones(16, dtype=np.float32)
    comm.all_reduce(x)
    if comm.rank == 1:
        os.kill(os.getpid(), 9)
    time.sleep(0.2)
    try:
        comm.all_reduce(x)
        raise AssertionError("all_reduce with a dead peer did not raise")
    except mwms.PeerError as e:
        record("peer_error", **error_fields(e))
    try:
        comm.all_reduce(x)
    except mwms.InvalidUsage as e:
        record("poisoned", **error_fields(e))


def mismatch() -> None:
    """Ranks all-reduce different counts: both get CollectiveMismatchError."""
    comm = mwms.Communicator(timeout_seconds=30)
    x = np.ones(10 + 2 * comm.rank, dtype=np.float32)
    try:
        comm.all_reduce(x)
        raise AssertionError("mismatched all_reduce did not raise")
    except mwms.CollectiveMismatchError as e:
        record("mismatch", **error_fields(e))


def timeout() -> None:
    """Rank 1 arrives 4 s late to a collective whose deadline is 1 s."""
    comm = mwms.Communicator(timeout_seconds=1)
    x = np.ones(4, dtype=np.float32)
    if comm.rank == 1:
        time.sleep(4)
        # Rank 0 sent its part before it timed out, so this rank's first collective may still
        # complete; the abort rank 0 sent fails the next one at the latest.
        try:
            comm.all_reduce(x)
            comm.all_reduce(x)
        except mwms.Error as e:
            record("error", **error_fields(e))
        return
    try:
        comm.all_reduce(x)
        raise AssertionError("all_reduce did not raise")
    except mwms.Error as e:
        record("error", **error_fields(e), is_builtin_timeout=isinstance(e, TimeoutError))


def interrupt() -> None:
    """Ranks 0 and 1 block in a collective that rank 2 joins late; the test sends rank 0 SIGINT
    while both wait."""
    comm = mwms.Communicator(timeout_seconds=120)
    x = np.ones(4, dtype=np.float32)
    restore = os.environ.get("MWMS_TEST_RESTORE_HANDLER") == "1"
    if restore:
        # Our SIGINT handler is checked in front of Python's here, then signal.signal() puts
        # Python's back just before the blocked call, which starts trusting the check made
        # milliseconds ago: Note [python interrupts]'s watcher must chain ours in front again.
        import signal
        comm.barrier()
        if comm.rank == 0:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if comm.rank == 2:
        time.sleep(4)
        try:
            comm.all_reduce(x)
            comm.all_reduce(x)
        except mwms.Error as e:
            record("error", **error_fields(e))
        return
    print("BLOCKING", flush=True)
    try:
        comm.all_reduce(x)
        raise AssertionError("all_reduce returned")
    except KeyboardInterrupt:
        record("interrupted", at=time.monotonic())
    except mwms.PeerError as e:
        record("peer_error", **error_fields(e), at=time.monotonic())
        return
    try:
        comm.all_reduce(x)
    except mwms.InvalidUsage as e:
        record("after", **error_fields(e))


def custom_handler() -> None:
    """A SIGINT handler of the program's own (one that does not raise) is left alone: the
    collective is not aborted, it completes when the late rank arrives, then the handler runs."""
    import signal
    seen = []
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    comm = mwms.Communicator(timeout_seconds=60)
    x = np.full(4, comm.rank + 1, dtype=np.float32)
    if comm.rank == 1:
        time.sleep(2)
    else:
        print("BLOCKING", flush=True)
    comm.all_reduce(x)
    assert (x == 3).all()
    comm.barrier()
    comm.finalize()
    record("custom_handler", rank=comm.rank, seen=seen)


def strategy() -> None:
    """MultiWorkerMirroredStrategy: sharding, variable broadcast, gradient sums, reduce."""
    s = mwms.MultiWorkerMirroredStrategy(bytes_per_pack=4096, timeout_seconds=60)
    r = s.worker_index
    assert s.num_replicas_in_sync == 2 and s.num_workers == 2 and s.is_chief == (r == 0)
    assert s.bytes_per_pack == 4096
    assert s.batch_shard(5) == (slice(0, 3) if r == 0 else slice(3, 5))
    w = np.full((3, 3), 10.0 * (r + 1), dtype=np.float32)
    bias = np.arange(5, dtype=np.float64) + 100 * r
    s.broadcast_variables([w, bias])
    assert (w == 10).all() and (bias == np.arange(5)).all()
    # Several buckets (4096 bytes each): a 3000-float array alone, small ones packed together.
    grads = [np.full(3000, r + 1, dtype=np.float32), np.full(7, 2 * r, dtype=np.float32),
             np.full(4, r + 1, dtype=np.float64), np.full(3, r, dtype=np.int64)]
    s.all_reduce_gradients(grads)
    assert (grads[0] == 3).all() and (grads[1] == 2).all()
    assert (grads[2] == 3).all() and (grads[3] == 1).all()
    m = [np.full(8, 2.0 * r, dtype=np.float32)]
    s.all_reduce_gradients(m, op="mean")
    assert (m[0] == 1).all()
    assert s.reduce("sum", r + 1.5) == 4.0
    assert s.reduce(mwms.ReduceOp.MAX, float(r)) == 1.0
    assert s.all_reduce_bytes == 4 * 3000 + 4 * 7 + 8 * 4 + 8 * 3 + 4 * 8
    with warnings.catch_warnings(record=True) as caught:  # the old spelling still reads, warns
        warnings.simplefilter("always")
        assert s.allreduce_bytes == s.all_reduce_bytes
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    try:
        s.all_reduce_gradients([np.ones(3, dtype=np.float32), np.ones(4)[::2]])
        raise AssertionError("a non-contiguous gradient was accepted")
    except mwms.InvalidArgument as e:
        assert "gradients[1]" in str(e) and "C-contiguous" in str(e)
    # The overlapped step (begin / ready / finish), gradients listed last layer first.
    grads = [np.full(1000, r + 1.0, dtype=np.float32), np.full(5, 2.0 * r, dtype=np.float64),
             np.full(3000, -1.0 * r, dtype=np.float32)]
    s.begin_gradient_sync(grads)
    try:
        s.begin_gradient_sync(grads)
        raise AssertionError("a second begin_gradient_sync was accepted")
    except mwms.InvalidUsage as e:
        assert "begin_gradient_sync called again" in str(e)
    s.gradient_ready(1)
    s.gradient_ready(0)
    s.finish_gradient_sync()
    assert (grads[0] == 3).all() and (grads[1] == 2).all() and (grads[2] == -1).all()
    assert 0 <= s.exposed_all_reduce_seconds <= s.all_reduce_seconds
    try:
        s.finish_gradient_sync()
        raise AssertionError("finish without begin was accepted")
    except mwms.InvalidUsage:
        pass
    s.finalize()
    record("strategy", rank=r)


def torch_tensors() -> None:
    """PyTorch CPU tensors (DLPack): every collective on every dtype in the tensor's own memory,
    views and 0-d tensors, a leaf that requires grad, the errors, and the strategy on a real
    torch.nn model whose data-parallel step must equal the full-batch step."""
    import torch

    comm = mwms.Communicator(timeout_seconds=60)
    r, n = comm.rank, comm.world_size
    kinds = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
             torch.int64]
    for dt in kinds:
        for count in (1, 1000, 300_000):
            base = torch.arange(count, dtype=torch.float64) % 5  # exact in every dtype
            x = (base + r).to(dt)
            where = x.data_ptr()
            comm.all_reduce(x)
            assert x.data_ptr() == where and x.dtype == dt
            assert torch.equal(x.double(), 2 * base + 1), (dt, count)
            x = (base + r).to(dt)
            comm.all_reduce(x, "max")
            assert torch.equal(x.double(), base + 1)
            recv = torch.full((n * count,), -1, dtype=dt)
            comm.all_gather((base + 10 * r).to(dt), recv)
            assert torch.equal(recv.double(), torch.cat([base + 10 * k for k in range(n)]))
            send = torch.cat([base + k + r for k in range(n)]).to(dt)
            out = torch.full((count,), -1, dtype=dt)
            comm.reduce_scatter(send, out)
            assert torch.equal(out.double(), 2 * base + 2 * r + 1)
            x = (base + 3 * r).to(dt)
            comm.broadcast(x, root=1)
            assert torch.equal(x.double(), base + 3)
    # Views: a contiguous slice (a storage offset) changes its base; a 2-d tensor, a 0-d one.
    big = torch.zeros(10)
    big[2:6] = r + 1
    comm.all_reduce(big[2:6])
    assert big.tolist() == [0, 0, 3, 3, 3, 3, 0, 0, 0, 0]
    m = torch.full((3, 4), r + 1, dtype=torch.int64)
    comm.all_reduce(m)
    assert m.shape == (3, 4) and bool((m == 3).all())
    scalar = torch.tensor(float(r + 1), dtype=torch.float64)
    comm.all_reduce(scalar)
    assert scalar.item() == 3.0
    # A NumPy array and the tensor torch.from_numpy made of it share memory: both see it.
    a = np.full(8, r + 1, dtype=np.float32)
    comm.all_reduce(torch.from_numpy(a))
    assert (a == 3).all()
    # A leaf that requires grad is reduced in place, as torch.distributed.all_reduce does.
    leaf = torch.full((4,), float(r + 1), requires_grad=True)
    comm.all_reduce(leaf)
    assert leaf.requires_grad and leaf.detach().tolist() == [3.0] * 4
    # Asynchronous: the Work keeps the tensor's memory alive.
    t = torch.full((1000,), float(r), dtype=torch.float64)
    w = comm.all_reduce_async(t)
    where = t.data_ptr()
    w.wait()
    assert t.data_ptr() == where and bool((t == 1).all())
    # Refused, naming the argument, and nothing sent: the communicator stays usable.
    try:
        comm.all_reduce(torch.zeros(4, 4).t())
        raise AssertionError("a transposed tensor was accepted")
    except mwms.InvalidArgument as e:
        assert isinstance(e, ValueError)
        assert "argument 'tensor' is not C-contiguous" in str(e) and "x.contiguous()" in str(e)
    for bad in (torch.zeros(4, dtype=torch.uint8), torch.zeros(4, dtype=torch.bool),
                torch.zeros(4, dtype=torch.complex64), torch.zeros(4, dtype=torch.int16)):
        try:
            comm.all_reduce(bad)
            raise AssertionError(f"{bad.dtype} was accepted")
        except TypeError as e:
            assert "argument 'tensor' has dtype" in str(e), str(e)
    try:
        comm.all_gather(torch.zeros(2), torch.zeros(3))
        raise AssertionError("a recv of the wrong size was accepted")
    except mwms.InvalidArgument as e:
        assert "argument 'recv' has 3 elements" in str(e)
    try:
        comm.all_gather(torch.zeros(2), torch.zeros(4, dtype=torch.float64))
        raise AssertionError("send and recv of different dtypes were accepted")
    except TypeError as e:
        assert "argument 'recv' has dtype float64 but argument 'send' has float32" in str(e)
    x = torch.ones(3)
    comm.all_reduce(x)
    assert x.tolist() == [2.0] * 3
    comm.finalize()

    # The strategy on a torch.nn model: broadcast the chief's parameters, then one data-parallel
    # step (each worker's half of the batch, gradients all-reduced with op="mean" through
    # buckets) must give the weights that one process gets from the whole batch.
    s = mwms.MultiWorkerMirroredStrategy(bytes_per_pack=4096, timeout_seconds=60)
    torch.manual_seed(1234 + r)  # different initial weights on each worker
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 3))
    params = list(model.parameters())
    s.broadcast_variables([p.data for p in params])
    torch.manual_seed(1234)  # the chief's initial weights, made again by every worker
    reference = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 3))
    for p, q in zip(params, reference.parameters()):
        assert torch.equal(p.data, q.data)
    gen = torch.Generator().manual_seed(7)
    xb = torch.randn(32, 20, generator=gen)
    yb = torch.randint(0, 3, (32,), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()
    shard = s.batch_shard(32)
    loss_fn(model(xb[shard]), yb[shard]).backward()
    s.all_reduce_gradients([p.grad for p in params], op="mean")
    loss_fn(reference(xb), yb).backward()
    for p, q in zip(params, reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        for p, q in zip(params, reference.parameters()):
            p -= 0.1 * p.grad
            q -= 0.1 * q.grad
    for p, q in zip(params, reference.parameters()):
        torch.testing.assert_close(p.data, q.data, rtol=1e-5, atol=1e-6)
    assert s.all_reduce_bytes == sum(p.numel() * 4 for p in params)
    s.finalize()
    record("torch", rank=r, dtypes=[str(k) for k in kinds], torch=torch.__version__)


def _mlp_grads(w1, w2, x, y, global_batch):
    """Gradients of sum(cross-entropy) / global_batch over the rows x, y of a ReLU MLP."""
    h = np.maximum(x @ w1, 0.0)
    z = h @ w2
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).sum() / global_batch
    dz = p.copy()
    dz[np.arange(len(y)), y] -= 1.0
    dz /= global_batch
    g2 = h.T @ dz
    g1 = x.T @ ((dz @ w2.T) * (h > 0))
    return loss, g1, g2


def local_replicas() -> None:
    """2 workers x 2 local replicas (Note [python replicas]): ids and shards, variables from the
    chief's replica 0, and 3 steps of a NumPy MLP (plain and overlapped) that must equal one
    replica on the global batch; then a replica's exception on worker 1 fails both workers."""
    s = mwms.MultiWorkerMirroredStrategy(local_replicas=2, timeout_seconds=30,
                                         bytes_per_pack=256)
    r = s.worker_index
    assert (s.num_replicas_in_sync, s.num_local_replicas) == (4, 2)
    assert s.batch_shard(10) == (slice(0, 6) if r == 0 else slice(6, 10))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 8))
    y = rng.integers(0, 3, 32)
    ref1 = rng.standard_normal((8, 16)) * 0.3  # the chief's replica 0 makes these below
    ref2 = rng.standard_normal((16, 3)) * 0.3
    models = {}

    def init():
        ctx = mwms.get_replica_context()
        g = ctx.replica_id_in_sync_group
        if g == 0:
            w = [ref1.copy(), ref2.copy()]
        else:  # every other replica starts elsewhere
            w = [np.full((8, 16), float(g)), np.full((16, 3), -float(g))]
        ctx.broadcast_variables(w)
        models[ctx.local_replica_id] = w
        return g, ctx.batch_shard(32)

    got = s.run(init)
    assert [g for g, _ in got] == [2 * r, 2 * r + 1]
    assert [sh for _, sh in got] == [slice(8 * (2 * r + k), 8 * (2 * r + k + 1)) for k in (0, 1)]
    for w in models.values():
        np.testing.assert_array_equal(w[0], ref1)
        np.testing.assert_array_equal(w[1], ref2)

    def step(overlap):
        ctx = mwms.get_replica_context()
        w = models[ctx.local_replica_id]
        rows = ctx.batch_shard(32)
        loss, g1, g2 = _mlp_grads(w[0], w[1], x[rows], y[rows], 32)
        if overlap:
            ctx.begin_gradient_sync([g2, g1])
            ctx.gradient_ready(0)
            ctx.finish_gradient_sync()
        else:
            ctx.all_reduce("sum", [g1, g2])
        w[0] -= 0.5 * g1
        w[1] -= 0.5 * g2
        return loss

    for i, overlap in enumerate((False, True, False)):
        losses = s.run(step, (overlap,))
        loss, g1, g2 = _mlp_grads(ref1, ref2, x, y, 32)  # one replica, the whole batch
        ref1 -= 0.5 * g1
        ref2 -= 0.5 * g2
        assert abs(s.reduce("sum", losses) - loss) < 1e-12, (i, losses, loss)
        for w in models.values():
            np.testing.assert_allclose(w[0], ref1, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(w[1], ref2, rtol=1e-10, atol=1e-12)
    record("replicas_trained", rank=r)

    def failing():
        ctx = mwms.get_replica_context()
        if r == 1 and ctx.local_replica_id == 1:
            raise ValueError("bad batch on worker 1")
        ctx.all_reduce("sum", np.ones(4))

    try:
        s.run(failing)
        raise AssertionError("run() with a failing replica returned")
    except ValueError as e:  # worker 1: its replica's own exception
        record("replica_failed", worker=r, what=str(e))
        sys.stdout.flush()
        os._exit(3)  # as an uncaught exception ends the worker (without finalize)
    except mwms.PeerError as e:  # worker 0: the peer that left, named
        record("replica_failed", **error_fields(e))


def replica_interrupt() -> None:
    """2 workers x 2 local replicas; worker 1 comes 4 s late; the test sends worker 0 SIGINT
    while its replicas wait in a ReplicaContext collective."""
    s = mwms.MultiWorkerMirroredStrategy(local_replicas=2, timeout_seconds=120)

    def fn():
        mwms.get_replica_context().all_reduce("sum", np.ones(4, dtype=np.float32))

    if s.worker_index == 1:
        time.sleep(4)
        try:  # the first may complete: worker 0 had left its contribution before it aborted
            s.run(fn)
            s.run(fn)
        except mwms.Error as e:
            record("error", **error_fields(e))
        return
    print("BLOCKING", flush=True)
    try:
        s.run(fn)
        raise AssertionError("run returned")
    except KeyboardInterrupt:
        record("interrupted", at=time.monotonic())


if __name__ == "__main__":
    globals()[sys.argv[1]]()
