#!/usr/bin/env bash
# all_reduce from Python against all_reduce_perf (C++) and mpi4py, in interleaved rounds
# (issue 17's targets, docs/PERFORMANCE.md "Python"):
#   64 MiB float32: Python busbw >= 0.95x all_reduce_perf's, and >= 1.2x mpi4py's Allreduce
#                   (same run, same sizes, iterations interleaved: all_reduce_bench.py);
#   4 B float32:    Python time <= C++ time + 1.5 us.
# Each round runs, under `mpirun -np N` on this host (libmwms over shared memory in both):
#   all_reduce_perf -b 4 -e 4, all_reduce_bench.py -b 4 -e 4 (libmwms alone, as the C++ run),
#   all_reduce_bench.py -b 4 -e 4 --compare mpi4py,
#   all_reduce_perf -b 64M -e 64M, all_reduce_bench.py -b 64M -e 64M (alone, as the C++ run),
#   all_reduce_bench.py -b 64M -e 64M --compare mpi4py,
# with glibc keeping freed memory (Open MPI at its best, bench/README.md). The medians over rounds
# and their ratios are printed at the end and written to OUT/summary.json with every round's JSON.
# Usage: bench/python/compare.sh [--build DIR] [--python PY] [--rounds K] [-np N] [--out DIR]
#   DIR: the C++ build (default build; needs bin/all_reduce_perf), PY: a Python with mwms, numpy
#   and mpi4py (default DIR/venv/bin/python), K: rounds (default 3), N: ranks (default 2).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=build python="" rounds=3 np=2 out=""
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -np) np=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$python" ] || python=$build/venv/bin/python
perf=$build/bin/all_reduce_perf
[ -x "$perf" ] || { echo "compare.sh: no $perf (build the C++ tree first: README)" >&2; exit 2; }
"$python" -c "import mwms, numpy, mpi4py" 2>/dev/null || {
  echo "compare.sh: $python cannot import mwms, numpy and mpi4py (pip install mpi4py into the" \
       "venv of scripts/run_tests.sh, docs/python.md)" >&2; exit 2; }
[ -n "$out" ] || out=$(mktemp -d /tmp/mwms-pybench.XXXXXX)
mkdir -p "$out"
mpirun=(mpirun -np "$np" -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=-1)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
[ "$np" -gt "$(nproc)" ] && mpirun+=(--oversubscribe)
# Small messages need many iterations for a stable median; large ones few.
small=(-b 4 -e 4 -n 2000 -w 200)
large=(-b 64M -e 64M -n 20 -w 5)
for r in $(seq 1 "$rounds"); do
  echo "== round $r of $rounds"
  env -u TF_CONFIG "${mpirun[@]}" "$perf" "${small[@]}" --json "$out/cpp_small_$r.json" | grep -av '^#'
  env -u TF_CONFIG "${mpirun[@]}" "$python" "$here/all_reduce_bench.py" "${small[@]}" \
    --json "$out/py_small_$r.json" | grep -av '^#'
  env -u TF_CONFIG "${mpirun[@]}" "$python" "$here/all_reduce_bench.py" "${small[@]}" \
    --compare mpi4py --json "$out/py_small_mpi4py_$r.json" | grep -av '^#'
  env -u TF_CONFIG "${mpirun[@]}" "$perf" "${large[@]}" --json "$out/cpp_large_$r.json" | grep -av '^#'
  # Python against C++ alone, as for 4 B: interleaved with mpi4py's calls, each of ours also
  # pays for the memory traffic and cache that the other library's call left (C++ interleaved
  # with Open MPI measured 4.6 GB/s at 64 MiB where it ran 5.7 alone, 2026-12-07).
  env -u TF_CONFIG "${mpirun[@]}" "$python" "$here/all_reduce_bench.py" "${large[@]}" \
    --json "$out/py_large_$r.json" | grep -av '^#'
  env -u TF_CONFIG "${mpirun[@]}" "$python" "$here/all_reduce_bench.py" "${large[@]}" \
    --compare mpi4py --json "$out/py_large_mpi4py_$r.json" | grep -av '^#'
done
"$python" - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def row(kind, r):
    return json.load(open(f"{out}/{kind}_{r}.json"))[0]
def med(kind, key):
    return statistics.median(row(kind, r)[key] for r in range(1, rounds + 1))
def per_round(f):
    return [round(f(r), 3) for r in range(1, rounds + 1)]
s = {
    "rounds": rounds,
    "cpp_4B_time_us": med("cpp_small", "time_us"),
    "py_4B_time_us": med("py_small", "time_us"),
    "mpi4py_4B_time_us": med("py_small_mpi4py", "mpi4py_time_us"),
    "py_4B_time_us_beside_mpi4py": med("py_small_mpi4py", "time_us"),
    "cpp_64M_busbw": med("cpp_large", "busbw"),
    "py_64M_busbw": med("py_large", "busbw"),
    "mpi4py_64M_busbw": med("py_large_mpi4py", "mpi4py_busbw"),
    "py_64M_busbw_beside_mpi4py": med("py_large_mpi4py", "busbw"),
    "py_minus_cpp_4B_us_per_round": per_round(
        lambda r: row("py_small", r)["time_us"] - row("cpp_small", r)["time_us"]),
    "py_over_cpp_64M_per_round": per_round(
        lambda r: row("py_large", r)["busbw"] / row("cpp_large", r)["busbw"]),
    "py_over_mpi4py_64M_per_round": per_round(lambda r: row("py_large_mpi4py", r)["ratio"]),
}
s["py_minus_cpp_4B_us"] = s["py_4B_time_us"] - s["cpp_4B_time_us"]
s["py_over_cpp_64M"] = s["py_64M_busbw"] / s["cpp_64M_busbw"]
s["py_over_mpi4py_64M"] = statistics.median(s["py_over_mpi4py_64M_per_round"])
json.dump(s, open(f"{out}/summary.json", "w"), indent=1)
print(f"# medians of {rounds} rounds (raw JSON in {out})")
print(f"# 4 B:    C++ {s['cpp_4B_time_us']:.2f} us, Python {s['py_4B_time_us']:.2f} us, "
      f"mpi4py {s['mpi4py_4B_time_us']:.2f} us (Python beside it {s['py_4B_time_us_beside_mpi4py']:.2f}); Python - C++ = {s['py_minus_cpp_4B_us']:.2f} us "
      f"(target <= 1.5; per round {s['py_minus_cpp_4B_us_per_round']})")
print(f"# 64 MiB: busbw C++ {s['cpp_64M_busbw']:.2f}, Python {s['py_64M_busbw']:.2f}, mpi4py "
      f"{s['mpi4py_64M_busbw']:.2f} GB/s (Python beside it {s['py_64M_busbw_beside_mpi4py']:.2f}); Python / C++ = {s['py_over_cpp_64M']:.3f} (target >= "
      f"0.95; per round {s['py_over_cpp_64M_per_round']}); Python / mpi4py = "
      f"{s['py_over_mpi4py_64M']:.3f} (target >= 1.2; per round "
      f"{s['py_over_mpi4py_64M_per_round']})")
EOF
