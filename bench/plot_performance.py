#!/usr/bin/env python3
"""Tables and a plot of libmwms's bus bandwidth per backend beside Open MPI's.

Reads the --json files that bench/run_performance.sh wrote into a directory (each one run of a
*_perf tool with --compare mpi: the rows, then a summary record) and writes, for each collective
and rank count, a markdown table of busbw per size -- ours per backend, Open MPI, and the ratio --
and optionally a PNG of busbw against size.

Repetitions of a run are combined by medians: busbw is the median over repetitions; the ratio is
the median of the per-run ratios (each measured in one run, libmwms and MPI on the same buffers,
which is what keeps it meaningful on a noisy machine); the Open MPI column is the median over every
run at that rank count, whatever backend libmwms used in it.

Usage:
  python3 bench/plot_performance.py DIR [--markdown FILE] [--png FILE] [--update DOC]
    --markdown FILE  write the tables to FILE (default: print them)
    --png FILE       plot busbw and the ratio against size (needs matplotlib: on Debian,
                     apt-get install python3-matplotlib; only this option needs it)
    --update DOC     replace the text between "<!-- BEGIN generated tables -->" and
                     "<!-- END generated tables -->" in DOC (docs/PERFORMANCE.md) by the tables
"""

import argparse
import glob
import os
import statistics
import sys
from collections import defaultdict

from perf_tables import human_size, pyplot, read_run, table_row, table_rule, write_tables

BACKEND_ORDER = ["auto", "tcp", "shm", "mpi"]
BEGIN = "<!-- BEGIN generated tables -->"
END = "<!-- END generated tables -->"


def load(directory):
    """Returns {(collective, ranks): {backend: [run, ...]}}, a run being (rows, summary)."""
    runs = defaultdict(lambda: defaultdict(list))
    files = sorted(glob.glob(os.path.join(directory, "*.json")))
    if not files:
        sys.exit("plot_performance.py: no .json files in %s (run bench/run_performance.sh)" % directory)
    for path in files:
        rows, summary = read_run(path)
        if not rows:
            continue
        key = (rows[0]["collective"], rows[0]["ranks"])
        runs[key][rows[0]["backend"]].append((rows, summary))
    return runs


def backends_of(by_backend):
    known = [b for b in BACKEND_ORDER if b in by_backend]
    return known + sorted(b for b in by_backend if b not in BACKEND_ORDER)


def medians(by_backend):
    """Per size: {size: {backend: (busbw, ratio)}} and {size: open_mpi_busbw}."""
    ours = defaultdict(lambda: defaultdict(lambda: ([], [])))
    mpi = defaultdict(list)
    for backend, runs in by_backend.items():
        for rows, _ in runs:
            for r in rows:
                busbw, ratios = ours[r["size"]][backend]
                busbw.append(r["busbw"])
                if "mpi_busbw" in r:
                    ratios.append(r["ratio"])
                    mpi[r["size"]].append(r["mpi_busbw"])
    med = lambda v: statistics.median(v) if v else None
    table = {size: {b: (med(v[0]), med(v[1])) for b, v in per.items()} for size, per in ours.items()}
    return table, {size: med(v) for size, v in mpi.items()}


def fmt(value, digits=2):
    return "—" if value is None else "%.*f" % (digits, value)


def markdown(runs):
    out = []
    for (collective, ranks) in sorted(runs):
        by_backend = runs[(collective, ranks)]
        backends = backends_of(by_backend)
        table, mpi = medians(by_backend)
        out.append("### %s, n = %d\n" % (collective, ranks))
        for b in backends:
            summary = by_backend[b][0][1]
            out.append("- `%s`: %d run(s); %s" % (b, len(by_backend[b]), summary.get("describe", "?")))
        any_summary = next(iter(by_backend.values()))[0][1]
        if any_summary.get("mpi_library"):
            kept = "kept" if any_summary.get("malloc_keeps_freed") else "NOT kept"
            out.append("- Open MPI: %s (glibc freed memory %s)" % (any_summary["mpi_library"], kept))
        out.append("")
        head = ["size"] + ["%s busbw" % b for b in backends] + ["Open MPI busbw"]
        head += ["%s / MPI" % b for b in backends]
        out.append(table_row(head))
        out.append(table_rule(len(head)))
        for size in sorted(table):
            cells = [human_size(size)]
            cells += [fmt(table[size].get(b, (None, None))[0]) for b in backends]
            cells.append(fmt(mpi.get(size)))
            cells += [fmt(table[size].get(b, (None, None))[1]) for b in backends]
            out.append(table_row(cells))
        # The tools' footer numbers, as medians over repetitions ("—" where a file lacks them).
        def footer(key, summaries):
            values = [s[key] for s in summaries if key in s]
            return fmt(statistics.median(values)) if values else fmt(None)
        every = [s for b in backends for _, s in by_backend[b]]
        cells = [footer("avg_busbw", [s for _, s in by_backend[b]]) for b in backends]
        cells.append(footer("avg_mpi_busbw", every))
        cells += [footer("median_ratio", [s for _, s in by_backend[b]]) for b in backends]
        out.append("| **avg busbw / median ratio** | " + " | ".join(cells) + " |")
        out.append("")
    out.append("busbw in GB/s (10^9 B/s), median over repetitions; ratio = libmwms busbw / Open MPI "
               "busbw in the same run, median over repetitions (above 1: libmwms is faster).")
    return "\n".join(out) + "\n"


def plot(runs, path):
    plt = pyplot("plot_performance.py")
    keys = sorted(runs)
    fig, axes = plt.subplots(2, len(keys), figsize=(6 * len(keys), 8), squeeze=False)
    for col, key in enumerate(keys):
        by_backend = runs[key]
        table, mpi = medians(by_backend)
        sizes = sorted(table)
        top, bottom = axes[0][col], axes[1][col]
        for b in backends_of(by_backend):
            xs = [s for s in sizes if b in table[s] and table[s][b][0]]
            top.plot(xs, [table[s][b][0] for s in xs], marker="o", label="libmwms %s" % b)
            rs = [s for s in xs if table[s][b][1] is not None]
            bottom.plot(rs, [table[s][b][1] for s in rs], marker="o", label="%s / Open MPI" % b)
        xs = [s for s in sizes if mpi.get(s)]
        top.plot(xs, [mpi[s] for s in xs], "k--", marker="s", label="Open MPI")
        top.set_title("%s, n = %d" % key)
        top.set_ylabel("busbw (GB/s)")
        top.set_xscale("log", base=2)
        top.set_yscale("log")
        bottom.axhline(1.0, color="k", linestyle=":")
        bottom.set_xscale("log", base=2)
        bottom.set_yscale("log")
        bottom.set_xlabel("size per rank (bytes)")
        bottom.set_ylabel("busbw ratio (libmwms / Open MPI)")
        for ax in (top, bottom):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def update(doc, tables):
    with open(doc) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        sys.exit("plot_performance.py: %s has no %s ... %s markers" % (doc, BEGIN, END))
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc, "w") as f:
        f.write(head + BEGIN + "\n" + tables + END + tail)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--markdown")
    parser.add_argument("--png")
    parser.add_argument("--update")
    args = parser.parse_args()
    runs = load(args.directory)
    tables = markdown(runs)
    if args.markdown or not args.update:
        write_tables(tables, args.markdown)  # printed when neither --markdown nor --update
    if args.update:
        update(args.update, tables)
    if args.png:
        plot(runs, args.png)


if __name__ == "__main__":
    main()
