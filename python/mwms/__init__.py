"""libmwms for Python: TF-style multi-worker collectives over NumPy buffers, without copies.

One implementation: every call goes to the C++ library (include/mwms) through the ``_mwms``
extension. See docs/python.md.

>>> import mwms, numpy as np
>>> cluster = mwms.resolve()                 # TF_CONFIG, mpirun, torchrun, Slurm or one process
>>> with mwms.Communicator(cluster) as comm:  # finalize() on exit
...     grad = np.ones(1024, dtype=np.float32)
...     comm.all_reduce(grad, "sum")          # in place
"""
from ._errors import (BackendError, BootstrapError, BootstrapTimeoutError, CheckpointError,
                      CollectiveMismatchError,
                      Error, InternalError, InvalidArgument, InvalidUsage, PeerError,
                      ReplicaError, TimeoutError)
from ._mwms import (HAVE_CUDA, HAVE_MPI, Cluster, Communicator, MultiWorkerMirroredStrategy,
                    ReduceOp, ReplicaContext, Work, __version__, get_replica_context, resolve,
                    resolve_explicit, resolve_flags)

__all__ = [
    "BackendError", "BootstrapError", "BootstrapTimeoutError", "CheckpointError", "Cluster",
    "CollectiveMismatchError", "Communicator", "Error", "HAVE_CUDA", "HAVE_MPI", "InternalError",
    "InvalidArgument", "InvalidUsage", "MultiWorkerMirroredStrategy", "PeerError", "ReduceOp",
    "ReplicaContext", "ReplicaError", "TimeoutError", "Work", "__version__",
    "get_replica_context", "resolve", "resolve_explicit", "resolve_flags",
]
