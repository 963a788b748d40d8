"""One slot of a run: ``train_fn(**kwargs)`` in a fresh Python process (Note [slot process]).

Parent side: ``start_slot`` writes the pickled payload into a private directory and starts
``python -m mwms.spark._slot_main PAYLOAD RESULT`` with the slot's environment and its listening
socket; ``Slot.wait`` returns the slot's ``Outcome``. Child side: ``main`` runs the function and
writes the outcome (the chief's pickled return value, or the failure with its traceback).

Note [slot process]: a Spark task does not run ``train_fn`` in its own Python worker, because
libmwms reads its ``MWMS_*`` variables once per process (docs/env.md) and adopts
``MWMS_LISTEN_FD`` once: a reused worker (``spark.python.worker.reuse``, the default) would
run a second job with the first job's auth key. A fresh interpreter per slot gets this run's
variables, leaves nothing behind in the worker, and turns a crash of the process into an error
of the run. Local mode starts the same process, so both modes share one path. The child watches
its stdin, a pipe from the parent, and exits when it closes: when Spark kills a task's worker
(a sibling task failed, the job was cancelled), its slot process does not linger.
"""
from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

# Exit status of a slot process whose parent went away (its stdin closed) before it finished.
_EXIT_ORPHANED = 70


def dumps(obj: Any) -> bytes:
    """Pickles by value what plain pickle would pickle by reference only when it has to.

    cloudpickle (pyspark ships a copy) pickles functions defined in ``__main__``, a notebook or a
    closure by value, as Spark does for its tasks; without it, train_fn must be importable.
    """
    try:
        import cloudpickle  # type: ignore[import-not-found]
    except ImportError:
        try:
            from pyspark import cloudpickle  # type: ignore[import-not-found,no-redef]
        except ImportError:
            return pickle.dumps(obj)
    return cloudpickle.dumps(obj)


@dataclass
class Outcome:
    """What one slot ended with: its (pickled) result, or its failure."""
    ok: bool
    result: Optional[bytes] = None     # pickled return value (the chief's only)
    type_name: str = ""                # "ValueError", "mwms._errors.PeerError"
    message: str = ""
    traceback: str = ""                # the slot's formatted traceback
    exception: Optional[bytes] = None  # the pickled exception, None when it does not pickle
    consequential: bool = False        # a PeerError/TimeoutError: likely caused by another slot


class Slot:
    """A running slot process."""

    def __init__(self, proc: subprocess.Popen, result_path: str, index: int):
        self.proc = proc
        self.result_path = result_path
        self.index = index

    def wait(self, timeout: Optional[float] = None) -> Optional[Outcome]:
        """The slot's outcome; None if it is still running after `timeout` seconds."""
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            with open(self.result_path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            pass
        if status < 0:
            how = f"was killed by signal {signal.Signals(-status).name}"
        else:
            how = f"exited with status {status} before reporting"
        return Outcome(ok=False, type_name="RuntimeError",
                       message=f"the process of slot {self.index} (pid {self.proc.pid}) {how}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_slot(index: int, payload: bytes, workdir: str, env: Dict[str, str],
               pass_fds: Sequence[int] = ()) -> Slot:
    """Starts slot `index`: `payload` is made by ``make_payload``; `env` is its whole
    environment. `workdir` is a private directory (0700) of this run, for this slot's files."""
    payload_path = os.path.join(workdir, f"payload-{index}")
    result_path = os.path.join(workdir, f"result-{index}")
    with open(payload_path, "wb") as f:
        f.write(payload)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mwms.spark._slot_main", payload_path, result_path],
        env=env, pass_fds=tuple(pass_fds), stdin=subprocess.PIPE)
    return Slot(proc, result_path, index)


def make_payload(function: bytes, *, is_chief: bool, use_custom_strategy: bool) -> bytes:
    """The payload of one slot. `function` is dumps((train_fn, kwargs)); it is unpickled after
    the child put the parent's sys.path in front of its own (Spark's pyFiles, a notebook's
    directory), so that what it refers to by module imports there too."""
    return pickle.dumps({"function": function, "is_chief": is_chief,
                         "use_custom_strategy": use_custom_strategy, "sys_path": list(sys.path)})


# --- child side --------------------------------------------------------------------------------

_strategy = None  # the strategy the runner made for train_fn (use_custom_strategy=False)


def get_strategy():
    """The ``mwms.MultiWorkerMirroredStrategy`` that ``MirroredStrategyRunner`` created for this
    ``train_fn`` (``use_custom_strategy=False``, the default), as ``tf.distribute.get_strategy()``
    gives the strategy whose scope the original runner opened. It is finalized after train_fn
    returns. Raises RuntimeError outside such a train_fn."""
    if _strategy is None:
        raise RuntimeError(
            "mwms.spark.get_strategy() is only available inside a train_fn run by "
            "mwms.spark.MirroredStrategyRunner(use_custom_strategy=False); with "
            "use_custom_strategy=True, train_fn creates mwms.MultiWorkerMirroredStrategy() itself")
    return _strategy


def _watch_parent(workdir: str) -> None:
    """Exits the process when stdin (the parent's pipe) reaches end of file: the parent was
    killed. The run's private directory (its auth key) goes first, as the parent would have
    removed it."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    shutil.rmtree(workdir, ignore_errors=True)
    os._exit(_EXIT_ORPHANED)


def _failure(exc: BaseException) -> Outcome:
    try:
        import mwms
        consequential = isinstance(exc, (mwms.PeerError, mwms.TimeoutError))
    except ImportError:  # the failure may be that very import
        consequential = False
    try:
        pickled = dumps(exc)
        pickle.loads(pickled)  # a class whose constructor cannot take its own args fails here
    except Exception:  # noqa: BLE001 - any failure to pickle means: send the text only
        pickled = None
    cls = type(exc)
    name = cls.__qualname__
    if cls.__module__ != "builtins":
        name = f"{cls.__module__}.{name}"
    return Outcome(ok=False, type_name=name, message=str(exc),
                   traceback="".join(traceback.format_exception(cls, exc, exc.__traceback__)),
                   exception=pickled, consequential=consequential)


def _run(payload: Dict[str, Any]) -> Outcome:
    global _strategy
    import mwms
    train_fn, kwargs = pickle.loads(payload["function"])
    if payload["use_custom_strategy"]:
        result = train_fn(**kwargs)
    else:
        _strategy = mwms.MultiWorkerMirroredStrategy()
        try:
            result = train_fn(**kwargs)
            _strategy.finalize()
        finally:
            _strategy = None  # released before the interpreter exits
    # Only the chief's value goes back (the original returns partition 0's); pickled here, so
    # that a value that does not pickle fails this slot with its own traceback.
    return Outcome(ok=True, result=dumps(result) if payload["is_chief"] else None)


def main(argv: Sequence[str]) -> int:
    payload_path, result_path = argv
    threading.Thread(target=_watch_parent, args=(os.path.dirname(payload_path),),
                     name="mwms-spark-parent", daemon=True).start()
    try:
        with open(payload_path, "rb") as f:
            payload = pickle.load(f)
        sys.path[:0] = [p for p in payload["sys_path"] if p not in sys.path]
        outcome = _run(payload)
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt and SystemExit too
        outcome = _failure(exc)
    tmp = result_path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(outcome, f)
    os.replace(tmp, result_path)
    return 0

