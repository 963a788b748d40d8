"""``MirroredStrategyRunner``: the API of ``spark_tensorflow_distributor``'s runner over libmwms.

Cluster mode: a Spark barrier stage of one task per worker. Each task binds a listening socket
on a free port, ``BarrierTaskContext.allGather`` gives every task every task's ``host:port``, and
each starts its slot process (_slot.py) with the TF_CONFIG of its partition, the socket
(``MWMS_LISTEN_FD``: no other process can take the port between its choice and the listen) and
the run's auth key. The driver returns the chief's (partition 0's) return value. Local mode
starts the same slot processes on the driver, on loopback ports, without Spark.

Failures (Note [slot failures]): a slot that raised makes its task fail with the failure
(type, message, traceback, the pickled exception) encoded in the task's error text; Spark then
kills the other tasks of the barrier stage and aborts the job, and the driver decodes the
failure from Spark's error and raises the task's own exception, its traceback attached as the
cause. A slot that failed with a PeerError or a TimeoutError (most likely the consequence of
another slot's failure: its peer died) waits a few seconds before failing its task, so that the
slot that failed first, whose error says what went wrong, is the one the driver reports.
"""
from __future__ import annotations

import base64
import json
import logging
import math
import os
import pickle
import re
import secrets
import shutil
import socket
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import _slot

_logger = logging.getLogger("mwms.spark")

# How long a slot failing with a PeerError/TimeoutError holds back its report (Note [slot
# failures]); Spark kills its task sooner when the slot that caused it reports first.
_CONSEQUENTIAL_DELAY_SECONDS = 5.0
# Local mode: how long the other slots may run on after one failed (their peer is gone: they
# fail at once in a collective, or at their deadline when they are elsewhere).
_LOCAL_GRACE_SECONDS = 5.0
_FAILURE_MARK = re.compile(r"\[mwms-spark-failure ([A-Za-z0-9_=-]+)\]")
# Spark conf keys that accept running over an SSL-enabled cluster (libmwms does not encrypt).
_IGNORE_SSL_KEYS = ("mwms.spark.ignoreSsl", "tensorflow.spark.distributor.ignoreSsl")


class RemoteTraceback(Exception):
    """The traceback of a slot's failure, attached as ``__cause__`` of the exception that
    ``run`` raises (as ``concurrent.futures`` does for a worker process's failure)."""

    def __str__(self) -> str:
        return self.args[0]


class TrainingError(RuntimeError):
    """A slot failed with an exception that does not unpickle on the driver (its class is not
    importable there), or its process died: the message names the slot, the exception type and
    its message; ``type_name``, ``slot`` and the traceback (``__cause__``) are kept."""

    def __init__(self, message: str, type_name: str = "", slot: int = -1):
        super().__init__(message)
        self.type_name = type_name
        self.slot = slot


class _SlotFailed(RuntimeError):
    """Raised in a Spark task whose slot failed: its text carries the encoded Outcome."""


def _encode(slot: int, outcome: _slot.Outcome) -> str:
    blob = base64.urlsafe_b64encode(pickle.dumps((slot, outcome))).decode("ascii")
    return (f"mwms.spark: slot {slot} failed with {outcome.type_name}: {outcome.message}\n"
            f"[mwms-spark-failure {blob}]")


def _decode(text: str):
    m = _FAILURE_MARK.search(text)
    if m is None:
        return None
    try:
        return pickle.loads(base64.urlsafe_b64decode(m.group(1)))
    except Exception:  # noqa: BLE001 - a mangled mark: report Spark's own error instead
        return None


def _raise_failure(slot: int, outcome: _slot.Outcome) -> None:
    remote = RemoteTraceback(f"\nslot {slot} failed:\n\n{outcome.traceback or outcome.message}")
    exc: Optional[BaseException] = None
    if outcome.exception is not None:
        try:
            exc = pickle.loads(outcome.exception)
        except Exception:  # noqa: BLE001 - its class is not importable on the driver
            exc = None
    if not isinstance(exc, BaseException):
        exc = TrainingError(f"slot {slot} failed with {outcome.type_name}: {outcome.message}",
                            outcome.type_name, slot)
    raise exc from remote


def _gpus_owned(addresses: Sequence[str], resource: str) -> List[str]:
    """The CUDA device numbers behind Spark's addresses of `resource`: indices into
    CUDA_VISIBLE_DEVICES when the process already has one, else the addresses themselves."""
    bad = [a for a in addresses if not re.fullmatch(r"0|[1-9][0-9]*", a)]
    if bad:
        raise ValueError(f"Spark resource '{resource}' has addresses {list(addresses)}; "
                         "CUDA_VISIBLE_DEVICES needs non-negative integers without leading zeros")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        devices = visible.split(",")
        return [devices[int(a)] for a in addresses]
    return list(addresses)


def _slot_env(tf_config: Dict[str, Any], key_path: str, listen_fd: int,
              cuda_visible_devices: str) -> Dict[str, str]:
    env = dict(os.environ)
    # The run's key comes from its file; a key of the environment would conflict with it.
    env.pop("MWMS_AUTH_KEY", None)
    env["MWMS_AUTH_KEY_FILE"] = key_path
    env["TF_CONFIG"] = json.dumps(tf_config)
    env["MWMS_LISTEN_FD"] = str(listen_fd)
    env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    return env


def _tf_config(endpoints: Sequence[str], index: int) -> Dict[str, Any]:
    # TF's rule: with no "chief" job, worker 0 is the chief (as the original runner's TF_CONFIG).
    return {"cluster": {"worker": list(endpoints)}, "task": {"type": "worker", "index": index}}


def _listen(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def _private_dir(key: str) -> tuple:
    """A 0700 directory with the run's key in a 0600 file: (directory, key path)."""
    workdir = tempfile.mkdtemp(prefix="mwms-spark-")
    key_path = os.path.join(workdir, "auth_key")
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return workdir, key_path


def _task_devices(context, index: int, num_slots: int, num_tasks: int, resource: str) -> str:
    """CUDA_VISIBLE_DEVICES of task `index`: its share of num_slots GPUs, from its resources."""
    resources = context.resources()
    if resource not in resources:
        raise ValueError(f"task {index} has no Spark resource '{resource}': set "
                         f"spark.task.resource.{resource}.amount and the executors' and workers' "
                         f"spark.*.resource.{resource}.* confs")
    owned = _gpus_owned(resources[resource].addresses, resource)
    wanted = num_slots // num_tasks + (index < num_slots % num_tasks)
    return ",".join(owned[:wanted])


def _task_program(function: bytes, key: str, num_slots: int, num_tasks: int, use_gpu: bool,
                  gpu_resource_name: str, use_custom_strategy: bool) -> Callable:
    """The function of the barrier stage's partitions (runs in Spark's Python workers)."""

    def task(_rows):
        from pyspark import BarrierTaskContext
        context = BarrierTaskContext.get()
        index = context.partitionId()
        devices = ""
        if use_gpu:
            devices = _task_devices(context, index, num_slots, num_tasks, gpu_resource_name)
        host = context.getTaskInfos()[index].address.rsplit(":", 1)[0]
        with _listen("") as sock:
            endpoints = context.allGather(f"{host}:{sock.getsockname()[1]}")
            workdir, key_path = _private_dir(key)
            try:
                payload = _slot.make_payload(function, is_chief=index == 0,
                                             use_custom_strategy=use_custom_strategy)
                env = _slot_env(_tf_config(endpoints, index), key_path, sock.fileno(), devices)
                slot = _slot.start_slot(index, payload, workdir, env, pass_fds=[sock.fileno()])
                sock.close()  # the slot process has it now
                try:
                    outcome = slot.wait()
                finally:
                    slot.kill()  # only when this task is torn down with its slot running
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        if not outcome.ok:
            if outcome.consequential:
                time.sleep(_CONSEQUENTIAL_DELAY_SECONDS)
            raise _SlotFailed(_encode(index, outcome))
        return [outcome.result]

    return task


class MirroredStrategyRunner:
    """Runs a training function on ``num_slots`` workers wired together for libmwms, in a Spark
    barrier stage or as local processes: the API of
    ``spark_tensorflow_distributor.MirroredStrategyRunner`` (docs/python.md, "Spark").

    Args:
        num_slots: how many workers (processes) train. With ``use_gpu``, how many GPUs: the
            stage has ceil(num_slots / spark.task.resource.<gpu_resource_name>.amount) tasks.
        local_mode: run the slots as processes on the driver (loopback), without Spark.
        use_gpu: give each task the GPUs Spark scheduled to it (CUDA_VISIBLE_DEVICES); without,
            CUDA_VISIBLE_DEVICES is empty. The default is False here (the original's is True):
            the package's collectives are on host memory.
        gpu_resource_name: the Spark resource name of the GPUs.
        use_custom_strategy: False (default): the runner creates a
            ``mwms.MultiWorkerMirroredStrategy`` in each slot before train_fn, which gets it from
            ``mwms.spark.get_strategy()``, and finalizes it after train_fn returns. True:
            train_fn creates its own (from the TF_CONFIG the runner set).
    """

    def __init__(self, num_slots: int, *, local_mode: bool = False, use_gpu: bool = False,
                 gpu_resource_name: str = "gpu", use_custom_strategy: bool = False):
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots <= 0:
            raise ValueError(f"num_slots is {num_slots!r} but must be a positive integer")
        self._num_slots = num_slots
        self._local_mode = local_mode
        self._use_gpu = use_gpu
        self._gpu_resource_name = gpu_resource_name
        self._use_custom_strategy = use_custom_strategy
        self.sc = None
        self._num_tasks: Optional[int] = None
        if not local_mode or use_gpu:  # local mode needs Spark only for the driver's GPUs
            from pyspark.sql import SparkSession
            self.sc = SparkSession.builder.getOrCreate().sparkContext
        if not local_mode:
            self._num_tasks = self.get_num_tasks()
        _logger.info("mwms.spark: %d slots, %s, %s training", num_slots,
                     "local processes" if local_mode else f"{self._num_tasks} Spark tasks",
                     "GPU" if use_gpu else "CPU")

    def get_num_tasks(self) -> int:
        """The number of Spark tasks of the barrier stage."""
        if not self._use_gpu:
            return self._num_slots
        key = f"spark.task.resource.{self._gpu_resource_name}.amount"
        conf = self.sc.getConf()
        if not conf.contains(key):
            raise ValueError(f"use_gpu=True needs Spark's GPU-aware scheduling: the conf '{key}' "
                             "is not set")
        amount = int(float(conf.get(key)))
        if amount < 1:
            raise ValueError(f"the conf '{key}' is {conf.get(key)}; it must be at least 1")
        return math.ceil(self._num_slots / amount)

    def run(self, train_fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Runs ``train_fn(**kwargs)`` on every slot; returns the chief's (slot 0's) return value.

        A slot that raises fails the run: ``run`` raises that slot's exception (its class when
        it unpickles here, else ``TrainingError``) with the slot's traceback as ``__cause__``.
        """
        function = _slot.dumps((train_fn, kwargs))
        key = secrets.token_hex(32)  # this run's MWMS_AUTH_KEY; never logged
        if self._local_mode:
            return self._run_local(function, key)
        self._check_encryption()
        task = _task_program(function, key, self._num_slots, self._num_tasks, self._use_gpu,
                             self._gpu_resource_name, self._use_custom_strategy)
        rdd = self.sc.parallelize(range(self._num_tasks), self._num_tasks)
        failure = None
        try:
            results = rdd.barrier().mapPartitions(task).collect()
        except Exception as exc:  # noqa: BLE001 - a slot's failure, or Spark's own
            failure = _decode(str(exc))
            if failure is None:
                raise
        if failure is not None:
            _raise_failure(*failure)  # outside the except block: no "during handling" chain
        return pickle.loads(results[0])

    def _run_local(self, function: bytes, key: str) -> Any:
        if self._use_gpu:
            resources = self.sc.resources
            if self._gpu_resource_name not in resources:
                raise ValueError(f"the driver has no Spark resource '{self._gpu_resource_name}' "
                                 "(spark.driver.resource.<name>.* confs)")
            owned = _gpus_owned(resources[self._gpu_resource_name].addresses,
                                self._gpu_resource_name)
            if self._num_slots > len(owned):
                raise ValueError(f"{self._num_slots} slots requested for local GPU training but "
                                 f"the driver has {len(owned)} GPUs")
            devices = owned[:self._num_slots]
        else:
            devices = [""] * self._num_slots
        socks = [_listen("127.0.0.1") for _ in range(self._num_slots)]
        endpoints = [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
        workdir, key_path = _private_dir(key)
        slots: List[_slot.Slot] = []
        try:
            for i, sock in enumerate(socks):
                payload = _slot.make_payload(function, is_chief=i == 0,
                                             use_custom_strategy=self._use_custom_strategy)
                env = _slot_env(_tf_config(endpoints, i), key_path, sock.fileno(), devices[i])
                slots.append(_slot.start_slot(i, payload, workdir, env, [sock.fileno()]))
                sock.close()
            outcomes = _wait_local(slots)
        finally:
            for s in slots:
                s.kill()
            for sock in socks:
                sock.close()
            shutil.rmtree(workdir, ignore_errors=True)
        failed = [(i, o) for i, o in enumerate(outcomes) if o is not None and not o.ok]
        if failed:
            # The root cause first: a failure that is not a peer's consequence, the lowest slot.
            failed.sort(key=lambda f: (f[1].consequential, f[0]))
            _raise_failure(*failed[0])
        return pickle.loads(outcomes[0].result)

    def _check_encryption(self) -> None:
        """As the original: libmwms does not encrypt, so a cluster with spark.ssl.enabled is
        refused unless one of _IGNORE_SSL_KEYS is true."""
        conf = self.sc.getConf()
        if conf.get("spark.ssl.enabled", "false").lower() != "true":
            return
        if any(conf.get(k, "false").lower() == "true" for k in _IGNORE_SSL_KEYS):
            _logger.warning("mwms.spark: spark.ssl.enabled is true but libmwms does not encrypt "
                            "its traffic (authenticated, not encrypted: docs/security.md)")
            return
        raise RuntimeError(
            "this Spark cluster has TLS enabled (spark.ssl.enabled) but libmwms does not encrypt "
            "gradients in transit (its connections are authenticated, not encrypted); set "
            "'mwms.spark.ignoreSsl' to true in the Spark conf to run anyway")


def _wait_local(slots: List[_slot.Slot]) -> List[Optional[_slot.Outcome]]:
    """Waits for every slot; once one failed, the rest get _LOCAL_GRACE_SECONDS, then are
    killed (their outcome stays None), as Spark kills a failed barrier stage's other tasks."""
    outcomes: List[Optional[_slot.Outcome]] = [None] * len(slots)
    deadline = None
    pending = set(range(len(slots)))
    while pending:
        for i in sorted(pending):
            outcome = slots[i].wait(timeout=0.05)
            if outcome is not None:
                outcomes[i] = outcome
                pending.discard(i)
                if not outcome.ok and deadline is None:
                    deadline = time.monotonic() + _LOCAL_GRACE_SECONDS
        if deadline is not None and time.monotonic() > deadline:
            for i in pending:
                slots[i].kill()
            break
    return outcomes
