#!/usr/bin/env python3
"""all_reduce from Python: the nccl-tests table of ``all_reduce_perf``, timed on NumPy arrays.

Times ``mwms.Communicator.all_reduce`` (in place, on a C-contiguous NumPy array) over a sweep of
message sizes and prints the same table as ``build/bin/all_reduce_perf`` (bench/README.md):
per-iteration wall time, median of each rank, max over ranks; algbw = size / time; busbw =
algbw * 2(n-1)/n (nccl-tests' all-reduce bus factor). With ``--compare mpi4py`` every size is
also timed with mpi4py's ``Comm.Allreduce(MPI.IN_PLACE, array)`` on an array of the same size
and dtype, interleaved iteration by iteration with libmwms's (Note [interleaved comparison] in
bench/common/driver.cc), and the table gains mpi4py's time, busbw and the busbw ratio.

Launch it as any libmwms program (docs/python.md, "Launching")::

    mwmsrun -np 2 python bench/python/all_reduce_bench.py -b 4 -e 64M -f 4
    mpirun -np 2 python bench/python/all_reduce_bench.py --compare mpi4py   # needs mpi4py

Under ``mpirun`` the libmwms cluster is wired through mpi4py (when importable; with or without
``--compare``) when TF_CONFIG is not set: each rank
takes a free port on its host, the (host, port) pairs are all-gathered with MPI, and the ranks
form a TF_CONFIG cluster in MPI rank order. libmwms then runs exactly what users get (shared
memory on one host, TCP between hosts), whether the package was built with MPI or not.
``bench/python/compare.sh`` runs this beside ``all_reduce_perf`` in interleaved rounds (issue 17's
targets: docs/PERFORMANCE.md, "Python").

Every rank runs the same sizes and iteration counts; nothing that decides which collective runs
next reads a clock. Exit status: 0 when every checked result was right, 1 otherwise, 2 for a bad
command line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Callable, List, Optional

import numpy as np

import mwms

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_DTYPES = ("float32", "float64", "float16", "int32", "int64")


def parse_size(text: str) -> int:
    """'4', '64K', '64M', '1G' → bytes (nccl-tests' -b/-e syntax). Raises argparse errors."""
    t = text.strip().upper().rstrip("B")
    unit = t[-1:] if t[-1:] in _SUFFIX else ""
    try:
        value = int(t[: len(t) - len(unit)]) * _SUFFIX[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 4, 64K, 64M)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': a size must be positive")
    return value


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4"),
                   help="smallest message in bytes (default 4)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"),
                   help="largest message in bytes (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4,
                   help="multiply the size by this between rows (default 4)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed iterations first")
    p.add_argument("-d", "--datatype", choices=_DTYPES, default="float32")
    p.add_argument("-o", "--op", choices=("sum", "prod", "min", "max", "mean"), default="sum")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                   help="check the first iteration of every size (default 1)")
    p.add_argument("--compare", choices=("none", "mpi4py"), default="none",
                   help="also time mpi4py's Allreduce, interleaved (needs mpirun and mpi4py)")
    p.add_argument("--json", metavar="FILE", help="rank 0 writes the rows here (as all_reduce_perf)")
    a = p.parse_args(argv)
    if a.stepfactor < 2:
        p.error("-f/--stepfactor must be at least 2")
    if a.iters < 1 or a.warmup_iters < 0:
        p.error("-n must be at least 1 and -w at least 0")
    if a.minbytes > a.maxbytes:
        p.error("-b must not exceed -e")
    return a


def mpi_wired_cluster(mpi_comm: Any) -> "mwms.Cluster":
    """A libmwms cluster in MPI rank order, wired through MPI: each rank binds a free port on its
    host (released just before libmwms listens on it), and the (host, port) pairs are
    all-gathered. One host: 127.0.0.1; several: each rank's hostname."""
    hosts = mpi_comm.allgather(socket.gethostname())
    one_host = len(set(hosts)) == 1
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1" if one_host else "", 0))
        port = s.getsockname()[1]
    me = f"{'127.0.0.1' if one_host else hosts[mpi_comm.Get_rank()]}:{port}"
    workers = mpi_comm.allgather(me)
    return mwms.resolve({"cluster": {"worker": workers},
                         "task": {"type": "worker", "index": mpi_comm.Get_rank()}})


class Contender:
    """One implementation timed at one size: `run()` once in place; `settle()` after each
    iteration, outside its timing."""

    def __init__(self, name: str, run: Callable[[], None],
                 settle: Optional[Callable[[], None]] = None) -> None:
        self.name, self.run, self.settle = name, run, settle


def interleaved_medians(contenders: List[Contender], iters: int, warmups: int,
                        barrier: Callable[[], None]) -> List[float]:
    """Iteration i of every contender before iteration i + 1 of any (Note [interleaved
    comparison]); each contender's median iteration time in microseconds."""
    for c in contenders:
        for _ in range(warmups):
            c.run()
            if c.settle:
                c.settle()
    barrier()
    clock = time.perf_counter
    times = [[0.0] * iters for _ in contenders]
    for i in range(iters):
        for k, c in enumerate(contenders):
            run = c.run
            t0 = clock()
            run()
            t1 = clock()
            times[k][i] = (t1 - t0) * 1e6
            if c.settle:
                c.settle()
    return [statistics.median(t) for t in times]


def expected_value(op: str, n: int) -> float:
    """The result of the check fill (rank r holds r + 1) under `op` over n ranks."""
    return {"sum": n * (n + 1) / 2, "prod": float(np.prod(np.arange(1, n + 1))),
            "min": 1.0, "max": float(n), "mean": (n + 1) / 2}[op]


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    mpi_comm = None
    if a.compare == "mpi4py":
        try:
            from mpi4py import MPI
        except ImportError as e:
            print(f"all_reduce_bench: --compare mpi4py needs mpi4py ({e})", file=sys.stderr)
            return 2
        mpi_comm = MPI.COMM_WORLD
    cluster = None
    under_mpirun = "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ
    if not os.environ.get("TF_CONFIG") and (mpi_comm is not None or under_mpirun):
        if mpi_comm is None:  # wiring only: mpi4py is not timed
            try:
                from mpi4py import MPI
                cluster = mpi_wired_cluster(MPI.COMM_WORLD)
            except ImportError:
                pass  # mwms.resolve() reads the launcher's variables (a build with MPI)
        else:
            cluster = mpi_wired_cluster(mpi_comm)
    comm = mwms.Communicator(cluster)
    rank, n = comm.rank, comm.world_size
    describe = comm.describe()
    if mpi_comm is not None and (mpi_comm.Get_size() != n or mpi_comm.Get_rank() != rank):
        print(f"all_reduce_bench: MPI has rank {mpi_comm.Get_rank()} of {mpi_comm.Get_size()} "
              f"but libmwms rank {rank} of {n}: launch with mpirun and no TF_CONFIG",
              file=sys.stderr)
        return 2
    dtype = np.dtype(a.datatype)
    factor = 2.0 * (n - 1) / n
    mpi_op = None
    if mpi_comm is not None:
        from mpi4py import MPI
        mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}.get(a.op)
        if mpi_op is None:
            print("all_reduce_bench: MPI has no mean; compare with -o sum", file=sys.stderr)
            return 2

    def leave_mpi() -> None:
        # Note [leaving mpi] (bench/common/driver.cc): Open MPI has no progress thread; a rank
        # whose Allreduce returned may still owe a peer its last send. The ranks leave MPI
        # together: a libmwms barrier runs while this thread keeps MPI progressing.
        work = comm.barrier_async()
        while not work.test():
            mpi_comm.Iprobe()
        work.wait()

    if rank == 0:
        print(f"# all_reduce_bench.py: mwms {mwms.__version__}, Python {sys.version.split()[0]}, "
              f"NumPy {np.__version__}")
        print(f"# minBytes {a.minbytes} maxBytes {a.maxbytes} step: {a.stepfactor}(factor) "
              f"warmup iters: {a.warmup_iters} iters: {a.iters} validation: {a.check} "
              f"compare: {a.compare}")
        print(f"# time: median iteration time of each rank, max over ranks; algbw = size / time; "
              f"busbw = algbw * {factor:g}")
        print(f"# Backend: used: {describe}")
        if mpi_comm is not None:
            from mpi4py import MPI
            print(f"# MPI: {MPI.Get_library_version().splitlines()[0].strip()}; "
                  f"mpi4py {__import__('mpi4py').__version__}")
        head = f"#{'size':>13} {'count':>13} {'type':>9} {'redop':>6} {'time':>10} " \
               f"{'algbw':>8} {'busbw':>8} {'#wrong':>7}"
        unit = f"#{'(B)':>13} {'(elements)':>13} {'':>9} {'':>6} {'(us)':>10} " \
               f"{'(GB/s)':>8} {'(GB/s)':>8} {'':>7}"
        if mpi_comm is not None:
            head += f" {'mpi4py time':>11} {'mpi4py busbw':>12} {'ratio':>7}"
            unit += f" {'(us)':>11} {'(GB/s)':>12} {'':>7}"
        print(head + "\n" + unit, flush=True)

    rows = []
    wrong_total = 0
    size = a.minbytes
    itemsize = dtype.itemsize
    while size <= a.maxbytes:
        count = max(1, size // itemsize)
        nbytes = count * itemsize
        buf = np.zeros(count, dtype=dtype)
        wrong = -1
        warmups = a.warmup_iters
        if a.check:
            buf.fill(rank + 1)
            comm.all_reduce(buf, a.op)
            want = np.array(expected_value(a.op, n)).astype(dtype)
            wrong = int(np.count_nonzero(buf != want))
            warmups = max(0, warmups - 1)
        buf.fill(1 if a.op == "prod" else 0)
        ar, op = comm.all_reduce, a.op
        contenders = [Contender("mwms", (lambda: ar(buf)) if op == "sum" else (lambda: ar(buf, op)))]
        if mpi_comm is not None:
            mbuf = np.full(count, 1 if a.op == "prod" else 0, dtype=dtype)
            allreduce, in_place = mpi_comm.Allreduce, __import__("mpi4py").MPI.IN_PLACE
            contenders.append(Contender("mpi4py", lambda: allreduce(in_place, mbuf, mpi_op),
                                        leave_mpi))
        medians = interleaved_medians(contenders, a.iters, warmups, comm.barrier)
        times = np.array(medians + [0.0] * (2 - len(medians)), dtype=np.float64)
        comm.all_reduce(times, "max")  # a collective ends when its slowest rank does
        counts = np.array([max(wrong, 0)], dtype=np.int64)
        comm.all_reduce(counts, "sum")
        wrong_total += int(counts[0]) if a.check else 0
        algbw = nbytes / times[0] / 1e3
        row = {"record": "row", "collective": "all_reduce", "size": nbytes, "count": count,
               "type": a.datatype, "redop": a.op, "ranks": n, "backend": "python",
               "time_us": float(times[0]), "algbw": algbw, "busbw": algbw * factor,
               "wrong": int(counts[0]) if a.check else None}
        line = f"{nbytes:>14} {count:>13} {a.datatype:>9} {a.op:>6} {times[0]:>10.2f} " \
               f"{algbw:>8.2f} {algbw * factor:>8.2f} {row['wrong'] if a.check else 'N/A':>7}"
        if mpi_comm is not None:
            mpi_busbw = nbytes / times[1] / 1e3 * factor
            row.update(mpi4py_time_us=float(times[1]), mpi4py_busbw=mpi_busbw,
                       ratio=(row["busbw"] / mpi_busbw) if mpi_busbw > 0 else times[1] / times[0])
            line += f" {times[1]:>11.2f} {mpi_busbw:>12.2f} {row['ratio']:>7.2f}"
        rows.append(row)
        if rank == 0:
            print(line, flush=True)
        size *= a.stepfactor

    comm.finalize()
    if rank == 0:
        print(f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {statistics.mean(r['busbw'] for r in rows):g} ")
        if mpi_comm is not None:
            print(f"# Median busbw ratio   : {statistics.median(r['ratio'] for r in rows):g} "
                  "(libmwms / mpi4py)")
        print("#", flush=True)
        if a.json:
            summary = {"record": "summary", "collective": "all_reduce", "ranks": n,
                       "backend": "python", "describe": describe,
                       "iters": a.iters, "warmup_iters": a.warmup_iters, "rows": len(rows),
                       "out_of_bounds": wrong_total, "ok": wrong_total == 0}
            with open(a.json, "w") as f:
                json.dump(rows + [summary], f, indent=1)
    return 0 if wrong_total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
