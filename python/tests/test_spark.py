"""mwms.spark.MirroredStrategyRunner on a real Spark (pyspark from PyPI, Java 17): a
`local-cluster[2,1,1024]` master, i.e. a standalone master and 2 workers with one core and one
executor JVM each, started inside the driver's JVM; the barrier stage's 2 tasks run in the two
executors' Python workers. Then local mode, without Spark. One SparkSession for the module.

Skipped, saying why, when pyspark is not installed or no Java runtime is found
(scripts/run_tests.sh installs both: pyspark into its venv, openjdk-17-jre-headless by setup.sh).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mwms
import mwms.spark
from mwms.spark import MirroredStrategyRunner, RemoteTraceback, TrainingError

import spark_train  # noqa: E402 - next to this file (pytest puts its directory on sys.path)

STEPS = 5
MASTER = "local-cluster[2,1,1024]"


def _java_missing() -> str:
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return ""
    return ("no Java runtime (java on PATH or JAVA_HOME); "
            "scripts/setup.sh installs openjdk-17-jre-headless")


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    pytest.importorskip("pyspark",
                        reason="pyspark is not installed (scripts/run_tests.sh installs it)")
    if _java_missing():
        pytest.skip(_java_missing())
    from pyspark.sql import SparkSession
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    # The executors' Python is this venv's (mwms installed); every address on loopback.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # GPU-aware scheduling with a made-up GPU "0" per worker (a discovery script; no GPU is
    # used): use_gpu=True's CUDA_VISIBLE_DEVICES comes from the task's resources.
    script = tmp_path_factory.mktemp("spark") / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0"]}\'\n')
    script.chmod(0o755)
    session = (SparkSession.builder.master(MASTER).appName("mwms-spark-tests")
               .config("spark.worker.resource.gpu.amount", "1")
               .config("spark.worker.resource.gpu.discoveryScript", str(script))
               .config("spark.executor.resource.gpu.amount", "1")
               .config("spark.task.resource.gpu.amount", "1")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.executor.memory", "512m")
               .config("spark.ui.showConsoleProgress", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.sparkContext.addPyFile(spark_train.__file__)
    yield session
    session.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_two_barrier_tasks_train_the_mlp_like_one_process(spark):
    runner = MirroredStrategyRunner(num_slots=2)  # cluster mode, CPU, the runner's strategy
    result = runner.run(spark_train.train_mlp, steps=STEPS)
    # The chief's return value: worker 0 of 2, every all-reduce summed over both.
    assert (result["worker_index"], result["num_workers"], result["is_chief"]) == (0, 2, True)
    assert result["sum_of_ranks_plus_one"] == 3.0
    assert result["workers_agree"]
    # Bit for bit what one process computes summing the two shards' gradients, and to
    # float32 rounding one gradient over the global batch of 8.
    for got, want in zip(result["params"], spark_train.reference(STEPS)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(result["params"], spark_train.reference(STEPS, shards=((0, 8),))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(result["params"][0], spark_train.initial_params()[0])  # it trained
    # TF_CONFIG as TF's rules want it: every task a worker, partition 0 (the chief) first.
    cfg = result["tf_config"]
    assert cfg["task"] == {"type": "worker", "index": 0}
    workers = cfg["cluster"]["worker"]
    assert list(cfg["cluster"]) == ["worker"] and len(workers) == 2 and len(set(workers)) == 2
    assert all(w.startswith("127.0.0.1:") for w in workers)
    # The run's key came in a file (gone after the run), not in the environment.
    assert result["auth_key_file"] and not result["auth_key_in_environment"]
    assert not os.path.exists(result["auth_key_file"])
    assert result["cuda_visible_devices"] == ""


def test_a_second_run_in_the_same_executors_gets_its_own_wiring(spark):
    # Spark reuses its Python workers; each run's slot is a fresh process with this run's key.
    first = MirroredStrategyRunner(num_slots=2).run(spark_train.train_mlp, steps=1)
    second = MirroredStrategyRunner(num_slots=2).run(spark_train.train_mlp, steps=2)
    for got, want in zip(second["params"], spark_train.reference(2)):
        np.testing.assert_array_equal(got, want)
    assert first["tf_config"]["cluster"] != second["tf_config"]["cluster"]  # fresh ports


def test_a_failing_task_fails_the_run_with_its_exception_and_traceback(spark):
    start = time.monotonic()
    with pytest.raises(spark_train.TrainingDiverged,
                       match="loss is nan at step 3 on worker 1") as info:
        MirroredStrategyRunner(num_slots=2).run(spark_train.train_fails)
    remote = info.value.__cause__
    assert isinstance(remote, RemoteTraceback)
    text = str(remote)
    assert "slot 1 failed" in text and "Traceback (most recent call last)" in text
    assert "in check_loss" in text and "in train_fails" in text
    assert "raise TrainingDiverged" in text
    assert time.monotonic() - start < 90


def test_a_hung_task_is_ended_by_the_deadline(spark, tmp_path):
    start = time.monotonic()
    with pytest.raises(mwms.TimeoutError) as info:
        MirroredStrategyRunner(num_slots=2, use_custom_strategy=True).run(
            spark_train.train_hangs, pid_dir=str(tmp_path), timeout_seconds=3)
    assert info.value.peer_rank == 1
    assert "slot 0 failed" in str(info.value.__cause__)
    assert time.monotonic() - start < 90
    # Spark killed the hung task; its slot process went with it.
    pid, workdir = (tmp_path / "hung.pid").read_text().split()
    pid = int(pid)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), f"the hung slot process {pid} is still running"
    assert not Path(workdir).exists(), "the hung slot's directory (the run's key) is left"


def test_use_gpu_sets_cuda_visible_devices_from_the_task_resources(spark):
    runner = MirroredStrategyRunner(num_slots=2, use_gpu=True)
    assert runner.get_num_tasks() == 2  # num_slots / spark.task.resource.gpu.amount
    result = runner.run(spark_train.train_mlp, steps=1)
    assert result["cuda_visible_devices"] == "0"


def test_gpu_addresses_map_through_cuda_visible_devices(monkeypatch):
    from mwms.spark._runner import _gpus_owned
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _gpus_owned(["1", "0"], "gpu") == ["1", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert _gpus_owned(["2", "0"], "gpu") == ["6", "4"]
    with pytest.raises(ValueError, match="without leading zeros"):
        _gpus_owned(["01"], "gpu")


# --- local mode: the same slots as processes on the driver, no Spark -------------------------

def test_local_mode_trains_the_same_weights():
    result = MirroredStrategyRunner(num_slots=2, local_mode=True).run(
        spark_train.train_mlp, steps=STEPS)
    assert (result["worker_index"], result["num_workers"]) == (0, 2)
    assert result["sum_of_ranks_plus_one"] == 3.0
    for got, want in zip(result["params"], spark_train.reference(STEPS)):
        np.testing.assert_array_equal(got, want)
    assert all(w.startswith("127.0.0.1:") for w in result["tf_config"]["cluster"]["worker"])


def _have_cloudpickle() -> bool:
    return any(importlib.util.find_spec(m) for m in ("cloudpickle", "pyspark"))


@pytest.mark.skipif(not _have_cloudpickle(),
                    reason="a closure pickles by value with cloudpickle (pyspark's or its own)")
def test_local_mode_custom_strategy_and_a_closure():
    offset = 100

    def train_fn(scale):  # defined here: pickled by value, as Spark's closures are
        out = spark_train.communicator_ranks()
        return {**out, "scaled": scale * out["sum"] + offset}

    result = MirroredStrategyRunner(num_slots=3, local_mode=True, use_custom_strategy=True).run(
        train_fn, scale=2)
    assert result["rank"] == 0 and result["world_size"] == 3 and result["is_chief"]
    assert result["sum"] == 6 and result["scaled"] == 112


def test_local_mode_failure():
    with pytest.raises(spark_train.TrainingDiverged, match="step 3") as info:
        MirroredStrategyRunner(num_slots=2, local_mode=True).run(spark_train.train_fails)
    assert "in check_loss" in str(info.value.__cause__)


@pytest.mark.skipif(not _have_cloudpickle(),
                    reason="a closure pickles by value with cloudpickle (pyspark's or its own)")
def test_local_mode_unpicklable_exception_and_get_strategy_outside():
    def train_fn():
        class Unpicklable(Exception):  # pickles its message only: unpickling calls it with 1
            def __init__(self, what, where):
                super().__init__(f"{what} {where}")
        raise Unpicklable("only", "here")

    with pytest.raises(TrainingError, match="slot 0 failed with .*Unpicklable: only here"):
        MirroredStrategyRunner(num_slots=1, local_mode=True, use_custom_strategy=True).run(train_fn)
    with pytest.raises(RuntimeError, match="only available inside a train_fn"):
        mwms.spark.get_strategy()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_num_slots_must_be_positive(bad):
    with pytest.raises(ValueError, match="num_slots"):
        MirroredStrategyRunner(num_slots=bad, local_mode=True)
