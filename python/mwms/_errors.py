"""The exception classes of libmwms, mirroring include/mwms/errors.h (docs/errors.md).

The extension raises these for every C++ ``mwms::Error`` (translated once, at the boundary). Each
carries the C++ ``ErrorContext`` as attributes: a field that did not apply is ``None``.
"""
from __future__ import annotations

import builtins
from typing import Any, Dict, Optional

__all__ = [
    "Error", "InvalidArgument", "InvalidUsage", "BootstrapError", "TimeoutError",
    "BootstrapTimeoutError", "PeerError",
    "CollectiveMismatchError", "ReplicaError", "BackendError", "CheckpointError", "InternalError",
]

_CONTEXT_FIELDS = (
    "rank", "world_size", "task", "peer_rank", "peer_address", "peer_task", "op", "seq",
    "transport", "bytes", "elapsed_seconds", "timeout_seconds", "cause",
)


class Error(Exception):
    """Root of every libmwms error (C++ ``mwms::Error``).

    ``str(e)`` is the C++ ``what()``: the message and, in brackets, the context. The context's
    fields are attributes (``None`` when they do not apply):

    - ``rank``, ``world_size``, ``task``: this process (``task`` like ``"worker 1"``);
    - ``peer_rank``, ``peer_address``, ``peer_task``: the rank that failed or disagreed;
    - ``op`` (``"all_reduce"``, ``"rendezvous"``, ...), ``seq`` (the collective's sequence number),
      ``transport``, ``bytes``, ``elapsed_seconds``, ``timeout_seconds``;
    - ``cause``: why the peer failed when known, ``"died"`` or ``"stalled"``; else ``None``.

    ``message`` is the message without the context.
    """

    rank: Optional[int]
    world_size: Optional[int]
    task: Optional[str]
    peer_rank: Optional[int]
    peer_address: Optional[str]
    peer_task: Optional[str]
    op: Optional[str]
    seq: Optional[int]
    transport: Optional[str]
    bytes: Optional[int]
    elapsed_seconds: Optional[float]
    timeout_seconds: Optional[float]
    cause: Optional[str]

    def __init__(self, what: str, message: Optional[str] = None, **context: Any) -> None:
        super().__init__(what)
        self.message: str = what if message is None else message
        unknown = set(context) - set(_CONTEXT_FIELDS)
        if unknown:
            raise builtins.TypeError(f"unknown error context field(s): {sorted(unknown)}")
        for field in _CONTEXT_FIELDS:
            setattr(self, field, context.get(field))

    @property
    def context(self) -> Dict[str, Any]:
        """The context fields that are set, as a dict."""
        return {f: getattr(self, f) for f in _CONTEXT_FIELDS if getattr(self, f) is not None}


class InvalidArgument(Error, builtins.ValueError):
    """A caller bug on this rank (bad buffer, count, dtype, root, option); nothing was sent and the
    communicator is still usable. Also a ``ValueError``."""


class InvalidUsage(Error):
    """A call in a state that forbids it: the communicator is poisoned by an earlier failure (or
    was interrupted, or aborted), or finalized. The message repeats the original cause."""


class BootstrapError(Error):
    """Cluster resolution, rendezvous or ring formation failed (bad TF_CONFIG, port in use, a task
    that never came up, differing cluster views). Fix the launch and restart every task."""


class TimeoutError(Error, builtins.TimeoutError):
    """An operation missed its deadline; names the rank waited for. The communicator is poisoned.
    Also a builtin ``TimeoutError``."""


class BootstrapTimeoutError(BootstrapError, TimeoutError):
    """A bootstrap deadline expired (MWMS_CONNECT_TIMEOUT_SECONDS): a task never joined the
    rendezvous, the leader was unreachable or silent, a link never connected. Both a
    ``BootstrapError`` and a ``TimeoutError`` (so also a builtin ``TimeoutError``)."""


class PeerError(Error):
    """A link to a peer failed (it died, closed without finalize, sent a corrupt frame, or
    aborted); ``peer_rank``/``peer_task``/``peer_address`` name it. The communicator is
    poisoned."""


class CollectiveMismatchError(Error):
    """Ranks called different collectives at the same sequence number (op, count, dtype, reduce
    op or root), or a peer had already finalized. A bug in the calling program; poisoned."""


class ReplicaError(Error):
    """Another local replica of this worker failed (local replicas are not bound in Python yet)."""


class BackendError(Error):
    """An operating-system, MPI, CUDA or NCCL call failed; ``native_code`` is its code."""

    native_code: Optional[int] = None


class CheckpointError(Error):
    """A checkpoint file that cannot be written or used; ``path`` names it."""

    path: Optional[str] = None


class InternalError(Error):
    """A libmwms invariant broke (a bug in libmwms): please report it with the message."""
