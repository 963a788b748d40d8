"""In-process tests on a world of one: argument checks (no copy, ever), the error classes,
resolve() and the package's surface."""
from __future__ import annotations

import json

import numpy as np
import pytest

import mwms


@pytest.fixture
def comm():
    c = mwms.Communicator(mwms.resolve("{}"))
    yield c
    c.finalize()


def test_world_of_one_collectives(comm):
    assert (comm.rank, comm.world_size) == (0, 1)
    x = np.arange(6, dtype=np.float32)
    comm.all_reduce(x, "sum")
    np.testing.assert_array_equal(x, np.arange(6))
    out = np.zeros(6, dtype=np.float32)
    comm.all_gather(x, out)
    np.testing.assert_array_equal(out, np.arange(6))
    comm.all_reduce_async(x).wait()
    comm.barrier()


def test_non_contiguous_refused(comm):
    x = np.zeros(10, dtype=np.float32)
    with pytest.raises(mwms.InvalidArgument, match="argument 'tensor' is not C-contiguous"):
        comm.all_reduce(x[::2])
    with pytest.raises(ValueError, match="not C-contiguous"):  # InvalidArgument is a ValueError
        comm.broadcast(np.zeros((4, 4), dtype=np.float64).T)
    # Still usable: an argument error sends nothing.
    comm.all_reduce(x)


def test_read_only_refused(comm):
    x = np.zeros(4, dtype=np.float32)
    x.flags.writeable = False
    with pytest.raises(mwms.InvalidArgument, match="argument 'tensor' is read-only"):
        comm.all_reduce(x)
    with pytest.raises(mwms.InvalidArgument, match="argument 'recv' is read-only"):
        comm.all_gather(np.zeros(4, dtype=np.float32), x)
    # A read-only send buffer is fine: it is only read.
    out = np.zeros(4, dtype=np.float32)
    comm.all_gather(x, out)


def test_wrong_dtype_and_type(comm):
    with pytest.raises(TypeError, match="argument 'tensor' has dtype uint8"):
        comm.all_reduce(np.zeros(4, dtype=np.uint8))
    with pytest.raises(TypeError, match="argument 'tensor' has dtype complex64"):
        comm.all_reduce(np.zeros(4, dtype=np.complex64))
    with pytest.raises(TypeError, match="argument 'tensor' must be an array"):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match="argument 'recv' has dtype float64 but argument 'send'"):
        comm.all_gather(np.zeros(2, dtype=np.float32), np.zeros(2, dtype=np.float64))
    with pytest.raises(mwms.InvalidArgument, match="unknown|reduce op"):
        comm.all_reduce(np.zeros(2, dtype=np.float32), "average")


def test_size_mismatch(comm):
    with pytest.raises(mwms.InvalidArgument,
                       match="argument 'recv' has 3 elements but needs world_size"):
        comm.all_gather(np.zeros(2, dtype=np.float32), np.zeros(3, dtype=np.float32))
    with pytest.raises(mwms.InvalidArgument,
                       match="argument 'send' has 5 elements but needs world_size"):
        comm.reduce_scatter(np.zeros(5, dtype=np.int32), np.zeros(4, dtype=np.int32))
    with pytest.raises(mwms.InvalidArgument, match="broadcast root 1 is outside"):
        comm.broadcast(np.zeros(2, dtype=np.float32), root=1)


def test_numpy_fast_path_sees_in_place_changes(comm):
    # Note [python numpy fast path]: once float32 came through the full import, a NumPy array is
    # read from numpy's struct; every change made to the array in place must still be seen.
    x = np.zeros(8, dtype=np.float32)
    comm.all_reduce(x)
    x.flags.writeable = False
    with pytest.raises(mwms.InvalidArgument, match="argument 'tensor' is read-only"):
        comm.all_reduce(x)
    x.flags.writeable = True
    x.shape = (2, 4)
    with pytest.raises(mwms.InvalidArgument, match="argument 'tensor' is not C-contiguous"):
        comm.all_reduce(x.T)
    with pytest.raises(mwms.InvalidArgument, match="'recv' has 4 elements but needs world_size "
                       r"\(1\) x the 8 elements"):
        comm.all_gather(x, np.zeros(4, dtype=np.float32))
    x.dtype = np.int32  # the same bytes, now int32: the fast path must say int32
    with pytest.raises(TypeError, match="'recv' has dtype float32 but argument 'send' has int32"):
        comm.all_gather(x, np.zeros(8, dtype=np.float32))
    x.dtype = np.uint32
    with pytest.raises(TypeError, match="argument 'tensor' has dtype uint32"):
        comm.all_reduce(x)
    x.dtype = np.float32
    x[...] = 1.5
    out = np.zeros(8, dtype=np.float32)
    comm.all_gather(x[1], out[4:])  # a contiguous view: its own data pointer and size
    np.testing.assert_array_equal(out, [0, 0, 0, 0, 1.5, 1.5, 1.5, 1.5])


def test_buffer_protocol_without_numpy_array(comm):
    # array.array exports the buffer protocol only; it is reduced in place.
    import array
    a = array.array("d", [1.0, 2.0])
    comm.all_reduce(a)
    assert list(a) == [1.0, 2.0]
    with pytest.raises(mwms.InvalidArgument, match="read-only"):
        comm.all_reduce(b"\0" * 8)


class _DeviceExporter:
    """Exports 4 float32 through a DLPack capsule (ctypes) whose DLTensor says it lives on
    `device_type` (2: kDLCUDA), as a CUDA tensor's __dlpack__ does; the data pointer is host
    memory, so nothing can go wrong if the check were missing, but the collective must refuse."""

    def __init__(self, device_type: int):
        import ctypes

        class DLDevice(ctypes.Structure):
            _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

        class DLDataType(ctypes.Structure):
            _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                        ("lanes", ctypes.c_uint16)]

        class DLTensor(ctypes.Structure):
            _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                        ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                        ("strides", ctypes.POINTER(ctypes.c_int64)),
                        ("byte_offset", ctypes.c_uint64)]

        class DLManagedTensor(ctypes.Structure):
            _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                        ("deleter", ctypes.c_void_p)]

        self._ctypes = ctypes
        self._host = (ctypes.c_float * 4)()
        self._shape = (ctypes.c_int64 * 1)(4)
        self._managed = DLManagedTensor(
            DLTensor(ctypes.cast(self._host, ctypes.c_void_p), DLDevice(device_type, 0), 1,
                     DLDataType(2, 32, 1), self._shape, None, 0), None, None)
        self.device_type = device_type

    def __dlpack__(self, **kwargs):
        ctypes = self._ctypes
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (self.device_type, 0)


def test_device_memory_refused(comm):
    # A CUDA array's DLPack capsule (device type 2) is refused naming the argument; this build's
    # Communicator takes host buffers, and the same capsule on the CPU (1) is reduced.
    with pytest.raises(mwms.InvalidArgument,
                       match=r"argument 'tensor' is not in host memory \(DLPack device type 2\)"):
        comm.all_reduce(_DeviceExporter(2))
    with pytest.raises(mwms.InvalidArgument, match="argument 'recv' is not in host memory"):
        comm.all_gather(np.zeros(4, dtype=np.float32), _DeviceExporter(2))
    host = _DeviceExporter(1)
    comm.all_gather(np.arange(4, dtype=np.float32), host)
    assert list(host._host) == [0.0, 1.0, 2.0, 3.0]


def test_finalized_and_context_manager():
    with mwms.Communicator(mwms.resolve("{}")) as c:
        c.barrier()
    with pytest.raises(mwms.InvalidUsage, match="finalized") as info:
        c.barrier()
    assert isinstance(info.value, mwms.Error) and info.value.op == "barrier"


def test_options_none_is_unset_and_old_sentinels_still_work():
    """Note [option sentinels]: None is the one 'not set' (the defaults); the 0.x spellings 0,
    -1 and '' still read as unset for one release; a set value is taken."""
    one = mwms.resolve("{}")
    for kwargs in ({},
                   dict(timeout_seconds=None, connect_timeout_seconds=None, transport=None,
                        algorithm=None, chunk_bytes=None, small_message_bytes=None),
                   dict(timeout_seconds=0, connect_timeout_seconds=0, algorithm="",
                        chunk_bytes=0, small_message_bytes=-1),
                   dict(timeout_seconds=5.0, chunk_bytes=8192, small_message_bytes=0)):
        with mwms.Communicator(one, **kwargs) as c:
            a = np.arange(5, dtype=np.float32)
            c.all_reduce(a)
            assert a.tolist() == [0, 1, 2, 3, 4], kwargs
    with pytest.raises(mwms.InvalidArgument, match="chunk_bytes must be at least 4096"):
        mwms.Communicator(one, chunk_bytes=1024)
    s = mwms.MultiWorkerMirroredStrategy(one, bytes_per_pack=None, timeout_seconds=None)
    try:  # resolved to the values in effect (the MWMS_* defaults here)
        assert s.bytes_per_pack > 0 and s.timeout_seconds > 0
    finally:
        s.finalize()
    s = mwms.MultiWorkerMirroredStrategy(one, bytes_per_pack=4096, timeout_seconds=7.0)
    try:
        assert s.bytes_per_pack == 4096 and s.timeout_seconds == 7.0
    finally:
        s.finalize()


def test_error_hierarchy():
    for cls in (mwms.InvalidArgument, mwms.InvalidUsage, mwms.BootstrapError,
                mwms.TimeoutError, mwms.PeerError, mwms.CollectiveMismatchError,
                mwms.ReplicaError, mwms.BackendError, mwms.CheckpointError, mwms.InternalError):
        assert issubclass(cls, mwms.Error)
    assert issubclass(mwms.InvalidArgument, ValueError)
    assert issubclass(mwms.TimeoutError, TimeoutError)
    assert not issubclass(mwms.PeerError, ValueError)


TF_CONFIG = {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]},
             "task": {"type": "worker", "index": 1}, "environment": "cloud"}


def test_resolve_tf_config_from_environment(monkeypatch):
    for var in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "RANK",
                "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TF_CONFIG", json.dumps(TF_CONFIG))
    c = mwms.resolve()
    assert (c.task_type, c.task_index, c.rank, c.task_id) == ("worker", 1, 2, 2)
    assert (c.world_size, c.num_workers, c.is_chief, c.in_ring) == (3, 3, False, True)
    assert c.cluster_spec == {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]}
    assert c.ring == ["host0:2222", "host1:2222", "host2:2222"]
    assert (c.source, c.task_name) == ("tf_config", "worker 1")
    monkeypatch.setenv("TF_CONFIG", json.dumps({**TF_CONFIG, "task": {"type": "chief",
                                                                      "index": 0}}))
    chief = mwms.resolve()
    assert (chief.rank, chief.is_chief) == (0, True)


def test_resolve_argument_flags_and_explicit():
    c = mwms.resolve(TF_CONFIG)  # a dict, or its JSON text
    assert c.rank == 2 and mwms.resolve(json.dumps(TF_CONFIG)).rank == 2
    f = mwms.resolve_flags("worker", 0, {"worker": ["a:1", "b:2"]})
    assert (f.rank, f.world_size, f.is_chief, f.source) == (0, 2, True, "flags")
    e = mwms.resolve_explicit({"worker": ["a:1", "b:2"]}, "worker", 1)
    assert (e.rank, e.world_size, e.source) == (1, 2, "explicit")
    one = mwms.resolve("{}")
    assert (one.rank, one.world_size, one.is_chief) == (0, 1, True)
    ev = mwms.resolve({"cluster": {"worker": ["a:1"], "evaluator": ["e:1"]},
                       "task": {"type": "evaluator", "index": 0}})
    assert (ev.in_ring, ev.world_size) == (False, 1)


def test_resolve_errors():
    with pytest.raises(mwms.BootstrapError, match=r"task worker 5 is out of range") as info:
        mwms.resolve({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 5}})
    assert isinstance(info.value, mwms.Error) and info.value.message
    with pytest.raises(mwms.BootstrapError, match="chief"):
        mwms.resolve({"cluster": {"master": ["a:1"]}, "task": {"type": "master", "index": 0}})
    with pytest.raises(mwms.BootstrapError):
        mwms.resolve("{not json")


def test_surface_documented():
    for name in mwms.__all__:
        obj = getattr(mwms, name)
        if callable(obj) and not isinstance(obj, bool):
            assert obj.__doc__, f"mwms.{name} has no docstring"
    for cls in (mwms.Communicator, mwms.MultiWorkerMirroredStrategy, mwms.Work, mwms.Cluster):
        for attr in dir(cls):
            if not attr.startswith("_"):
                assert getattr(cls, attr).__doc__, f"{cls.__name__}.{attr} has no docstring"
    assert mwms.HAVE_MPI in (True, False) and mwms.__version__


LAUNCHER_VARS = ("TF_CONFIG", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "RANK",
                 "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
                 "SLURM_NTASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
                 "SLURM_LOCALID")


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_resolve_launchers(clean_env):
    assert mwms.resolve().source == "default" and mwms.resolve().world_size == 1
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("LOCAL_RANK", "1")
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    clean_env.setenv("MASTER_PORT", "29500")
    t = mwms.resolve()
    assert (t.source, t.rank, t.world_size, t.local_rank, t.is_chief) == ("torchrun", 1, 2, 1,
                                                                         False)
    assert t.ring == ["127.0.0.1:29500"] and t.task_name == "torchrun rank 1"
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        clean_env.delenv(var)
    clean_env.setenv("SLURM_PROCID", "1")
    clean_env.setenv("SLURM_NTASKS", "2")
    clean_env.setenv("SLURM_STEP_NODELIST", "node[1-2]")
    clean_env.setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)")
    s = mwms.resolve()
    assert (s.source, s.rank, s.world_size) == ("slurm", 1, 2)
    assert s.cluster_spec == {"worker": [a for a in s.ring]} and s.ring[0].startswith("node1:")


def test_mpirun_without_mpi_in_the_build(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "0")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    c = mwms.resolve()  # the launcher's variables are read whatever the build
    assert (c.source, c.rank, c.world_size, c.task_name) == ("mpi", 0, 2, "mpi rank 0")
    if mwms.HAVE_MPI:
        pytest.skip("this build has MPI: the communicator would start MPI")
    with pytest.raises(mwms.BootstrapError, match="built without MPI"):
        mwms.Communicator(c)


def test_a_rendezvous_deadline_is_both_bootstrap_and_timeout_error(monkeypatch):
    # Worker 0 (the leader) of a 2-worker cluster whose worker 1 never starts: after the connect
    # timeout it raises BootstrapTimeoutError, caught by either parent (and builtin TimeoutError).
    import socket
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        ports = [a.getsockname()[1], b.getsockname()[1]]
    config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
              "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    with pytest.raises(mwms.BootstrapTimeoutError, match="never arrived: worker 1") as info:
        mwms.Communicator(mwms.resolve(), connect_timeout_seconds=1.0, transport="tcp")
    assert isinstance(info.value, mwms.BootstrapError)
    assert isinstance(info.value, mwms.TimeoutError)
    assert isinstance(info.value, TimeoutError)
