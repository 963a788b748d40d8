"""Test harness: runs N worker processes of tests/workers.py, wired like `mwmsrun` does it.

The harness binds one listening loopback socket per task itself and hands each to its process
(MWMS_LISTEN_FD, docs/env.md), with a TF_CONFIG naming every task's port, so no other process can
take a port between the choice and the listen.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

WORKERS = str(Path(__file__).resolve().parent / "workers.py")


@dataclass
class Task:
    """One finished worker: its exit status, output and the JSON records it printed."""
    returncode: int
    stdout: str
    stderr: str
    records: List[dict] = field(default_factory=list)

    def record(self, kind: str) -> dict:
        found = [r for r in self.records if r.get("kind") == kind]
        assert found, f"no '{kind}' record in the worker's output:\n{self.stdout}\n{self.stderr}"
        return found[-1]


class Job:
    """N running worker processes of one scenario."""

    def __init__(self, n: int, scenario: str, env: Optional[Dict[str, str]] = None):
        socks = []
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # A scenario that finalizes a Communicator and builds another object on the same
            # port binds it again; a connection accepted by this socket before the task adopted
            # it would otherwise hold the port in TIME_WAIT (the adopter sets it too late).
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(64)
            socks.append(s)
        self.addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
        self.procs: List[subprocess.Popen] = []
        self.early: Dict[int, List[str]] = {i: [] for i in range(n)}  # lines read before finish()
        for i, s in enumerate(socks):
            e = dict(os.environ)
            for var in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                        "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
                e.pop(var, None)
            e["TF_CONFIG"] = json.dumps({"cluster": {"worker": self.addresses},
                                         "task": {"type": "worker", "index": i}})
            e["MWMS_LISTEN_FD"] = str(s.fileno())
            e["MWMS_CONNECT_TIMEOUT_SECONDS"] = "30"
            e["PYTHONUNBUFFERED"] = "1"
            e.update(env or {})
            self.procs.append(subprocess.Popen(
                [sys.executable, WORKERS, scenario], env=e, pass_fds=(s.fileno(),),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for s in socks:
            s.close()

    def wait_for_line(self, rank: int, prefix: str, timeout: float = 30) -> str:
        """Reads rank's stdout until a line starting with `prefix` (the rest stays unread), for
        at most `timeout` seconds (the reader thread ends when the process does)."""
        proc = self.procs[rank]
        found: List[str] = []

        def read() -> None:
            for line in iter(proc.stdout.readline, ""):
                self.early[rank].append(line)
                if line.startswith(prefix):
                    found.append(line)
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not found:
            raise AssertionError(f"rank {rank} printed no '{prefix}' line in {timeout} s")
        return found[0]

    def finish(self, timeout: float = 60) -> List[Task]:
        tasks = []
        for i, p in enumerate(self.procs):
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in self.procs:
                    q.kill()
                out, err = p.communicate()
                raise AssertionError(f"rank {i} did not finish in {timeout} s:\n{out}\n{err}")
            out = "".join(self.early[i]) + out
            records = [json.loads(line[len("RECORD "):]) for line in out.splitlines()
                       if line.startswith("RECORD ")]
            tasks.append(Task(p.returncode, out, err, records))
        return tasks


@pytest.fixture
def run_job() -> Callable[..., List[Task]]:
    """run_job(n, scenario, env=None, expect_ok=True): runs a scenario on n processes."""

    def run(n: int, scenario: str, env: Optional[Dict[str, str]] = None,
            expect_ok: bool = True, timeout: float = 60) -> List[Task]:
        tasks = Job(n, scenario, env).finish(timeout)
        if expect_ok:
            for rank, t in enumerate(tasks):
                assert t.returncode == 0, (
                    f"rank {rank} exited with {t.returncode}:\n{t.stdout}\n{t.stderr}")
        return tasks

    return run


@pytest.fixture
def start_job() -> Callable[..., Job]:
    """start_job(n, scenario, env=None): starts a scenario and returns the running Job."""
    started: List[Job] = []

    def start(n: int, scenario: str, env: Optional[Dict[str, str]] = None) -> Job:
        job = Job(n, scenario, env)
        started.append(job)
        return job

    yield start
    for job in started:
        for p in job.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
