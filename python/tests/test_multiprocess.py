"""Two worker processes on loopback (conftest.Job): collectives with exact values, the error
hierarchy with a dead, late or mismatched peer, Ctrl-C in a blocked collective, the strategy."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest


def test_collectives_every_dtype(run_job):
    tasks = run_job(2, "collectives")
    for rank, t in enumerate(tasks):
        rec = t.record("collectives")
        assert rec["rank"] == rank
        expected = {"float32", "float64", "float16", "int32", "int64"}
        if importlib.util.find_spec("ml_dtypes"):
            expected.add("bfloat16")
        assert set(rec["dtypes"]) == expected


def test_torch_cpu_tensors(run_job):
    """PyTorch CPU tensors in place (workers.torch_tensors). scripts/run_tests.sh installs torch
    from PyPI; a venv without it skips this test and says so."""
    pytest.importorskip("torch", reason="PyTorch is not installed in this venv "
                        "(scripts/run_tests.sh installs it; MWMS_TEST_TORCH=0 leaves it out)")
    for rank, t in enumerate(run_job(2, "torch_tensors", timeout=120)):
        rec = t.record("torch")
        assert rec["rank"] == rank and len(rec["dtypes"]) == 6


def test_peer_killed_raises_peer_error_naming_it(run_job):
    tasks = run_job(2, "peer_killed", expect_ok=False)
    assert tasks[1].returncode == -signal.SIGKILL
    assert tasks[0].returncode == 0, tasks[0].stderr
    err = tasks[0].record("peer_error")
    assert err["type"] == "PeerError"
    assert (err["rank"], err["world_size"], err["peer_rank"]) == (0, 2, 1)
    assert err["peer_task"] == "worker 1"
    assert err["peer_address"].startswith("127.0.0.1:")
    assert err["op"] == "all_reduce" and err["seq"] == 1 and err["cause"] == "died"
    assert "rank 1" in err["what"]
    after = tasks[0].record("poisoned")
    assert after["type"] == "InvalidUsage" and "unusable" in after["what"]


def test_mismatch(run_job):
    for t in run_job(2, "mismatch"):
        err = t.record("mismatch")
        assert err["type"] == "CollectiveMismatchError" and "count" in err["what"]


def test_timeout_names_the_late_rank(run_job):
    tasks = run_job(2, "timeout", env={"MWMS_HEARTBEAT_SECONDS": "10"})
    err = tasks[0].record("error")
    assert err["type"] == "TimeoutError" and err["is_builtin_timeout"], err
    assert err["peer_rank"] == 1 and err["timeout_seconds"] == 1


def interrupt_rank_0(job, blocked):
    """Sends rank 0 SIGINT once the `blocked` ranks print BLOCKING and wait inside their
    collective; checks that every task exits 0 and that rank 0's KeyboardInterrupt came within
    1 s. Returns the tasks and when the signal was sent (time.monotonic())."""
    for rank in blocked:
        job.wait_for_line(rank, "BLOCKING")
    time.sleep(0.5)  # inside the collective by now
    sent = time.monotonic()
    job.procs[0].send_signal(signal.SIGINT)
    tasks = job.finish(timeout=60)
    for t in tasks:
        assert t.returncode == 0, t.stdout + t.stderr
    latency = tasks[0].record("interrupted")["at"] - sent
    assert latency < 1.0, f"KeyboardInterrupt came {latency:.2f} s after SIGINT"
    return tasks, sent


# Shared memory, TCP, and shared memory after signal.signal() put Python's handler back.
@pytest.mark.parametrize("transport,restore", [("auto", "0"), ("tcp", "0"), ("auto", "1")])
def test_ctrl_c_interrupts_a_blocked_collective(start_job, transport, restore):
    job = start_job(3, "interrupt",
                    env={"MWMS_TRANSPORT": transport, "MWMS_TEST_RESTORE_HANDLER": restore})
    tasks, sent = interrupt_rank_0(job, blocked=(0, 1))  # both wait for rank 2
    after = tasks[0].record("after")
    assert after["type"] == "InvalidUsage" and "interrupted" in after["what"]
    # Rank 1, blocked in the same collective, fails at once with the abort, naming rank 0.
    peer = tasks[1].record("peer_error")
    assert peer["peer_rank"] == 0 and "interrupted" in peer["what"]
    assert peer["at"] - sent < 2.0


def test_custom_sigint_handler_is_left_alone(start_job):
    job = start_job(2, "custom_handler")
    job.wait_for_line(0, "BLOCKING")
    time.sleep(0.5)  # inside the all_reduce, waiting for rank 1
    job.procs[0].send_signal(signal.SIGINT)
    tasks = job.finish(timeout=60)
    for t in tasks:
        assert t.returncode == 0, t.stdout + t.stderr
    assert tasks[0].record("custom_handler")["seen"] == [signal.SIGINT]


def test_strategy(run_job):
    for rank, t in enumerate(run_job(2, "strategy")):
        assert t.record("strategy")["rank"] == rank


def test_local_replicas_on_two_workers(run_job):
    tasks = run_job(2, "local_replicas", expect_ok=False)
    for rank, t in enumerate(tasks):
        assert t.record("replicas_trained")["rank"] == rank, t.stderr
    assert tasks[1].returncode == 3, tasks[1].stderr
    assert tasks[1].record("replica_failed")["what"] == "bad batch on worker 1"
    assert tasks[0].returncode == 0, tasks[0].stderr
    err = tasks[0].record("replica_failed")
    assert err["type"] == "PeerError" and err["peer_task"] == "worker 1", err
    assert err["rank"] == 0 and err["cause"] == "died", err


def test_ctrl_c_interrupts_replicas_blocked_in_a_collective(start_job):
    job = start_job(2, "replica_interrupt")
    tasks, _ = interrupt_rank_0(job, blocked=(0,))  # both replicas wait for worker 1
    err = tasks[1].record("error")  # worker 0's abort reaches worker 1, naming it
    assert err["type"] == "PeerError" and err["peer_task"] == "worker 0", err
    assert "interrupted" in err["what"], err


def test_packaged_mwmsrun():
    launcher = shutil.which("mwmsrun") or os.path.join(os.path.dirname(sys.executable), "mwmsrun")
    if not os.path.exists(launcher):
        pytest.fail("the package's mwmsrun console script is not installed")
    code = ("import mwms, numpy as np; c = mwms.Communicator(); x = np.array([c.rank + 1.0]); "
            "c.all_reduce(x); print('sum', x[0], 'rank', c.rank, 'of', c.world_size); "
            "c.finalize()")
    out = subprocess.run([launcher, "-np", "2", "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[0] sum 3.0 rank 0 of 2" in out.stdout and "[1] sum 3.0 rank 1 of 2" in out.stdout


def test_all_reduce_bench_checks_every_size(tmp_path):
    """bench/python/all_reduce_bench.py on 2 ranks: every size's first iteration is checked
    (rank r contributes r + 1, so every element must be 3) and the JSON rows say so."""
    launcher = shutil.which("mwmsrun") or os.path.join(os.path.dirname(sys.executable), "mwmsrun")
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python",
                         "all_reduce_bench.py")
    if not os.path.exists(bench):
        pytest.skip("bench/python is not beside this test (an installed package)")
    out_json = tmp_path / "rows.json"
    out = subprocess.run([launcher, "-np", "2", "--", sys.executable, bench, "-b", "4", "-e",
                          "1M", "-f", "16", "-n", "3", "-w", "1", "--json", str(out_json)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    records = json.loads(out_json.read_text())
    rows = [r for r in records if r["record"] == "row"]
    assert [r["size"] for r in rows] == [4, 64, 1024, 16384, 262144]
    assert all(r["wrong"] == 0 and r["ranks"] == 2 and r["time_us"] > 0 for r in rows)
    assert records[-1]["ok"] is True and "Out of bounds values : 0 OK" in out.stdout
