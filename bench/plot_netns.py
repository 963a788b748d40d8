#!/usr/bin/env python3
"""Tables and a plot of libmwms beside Open MPI's TCP transport and Gloo across test hosts.

Reads the --json files that bench/run_netns_compare.sh wrote into a directory, named
netns-RATE-<H>hosts-<K>streams.json (one mpirun job: all_reduce_perf --compare mpi,gloo, so every
ratio below comes from one run, the three implementations on the same links and buffers), and
writes a markdown table per rate and host count: busbw of libmwms, Open MPI and Gloo's two
algorithms, libmwms / Open MPI, libmwms / the better Gloo, and libmwms's busbw as a share of the
shaped link rate (busbw already carries the ring's 2(n-1)/n, so 1.0 is the link). With several
stream counts (MWMS_NSOCKS_PERPEER) it adds one table of libmwms's busbw per stream count.

Usage:
  python3 bench/plot_netns.py DIR [--markdown FILE] [--png FILE]
    --png FILE  busbw against size, one panel per rate and host count (needs matplotlib: on
                Debian, apt-get install python3-matplotlib; only this option needs it)
"""

import argparse
import glob
import os
import re
import sys
from collections import defaultdict

from perf_tables import human_size, pyplot, read_run, table_row, table_rule, write_tables

NAME = re.compile(r"netns-(?P<rate>[0-9]+[kmg]bit)-(?P<hosts>[0-9]+)hosts-(?P<streams>[0-9]+)streams\.json$")
UNIT = {"k": 1e3, "m": 1e6, "g": 1e9}


def link_gbytes(rate):
    """GB/s (10^9 B/s) of a tc rate such as 1gbit (tc's bit units are powers of 1000)."""
    m = re.match(r"([0-9]+)([kmg])bit", rate)
    return int(m.group(1)) * UNIT[m.group(2)] / 8e9


def load(directory):
    """{(rate, hosts): {streams: (rows, summary)}}"""
    runs = defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(directory, "netns-*.json"))):
        m = NAME.search(os.path.basename(path))
        if not m:
            continue
        runs[(m.group("rate"), int(m.group("hosts")))][int(m.group("streams"))] = read_run(
            path, untagged_is_row=False)
    if not runs:
        sys.exit("plot_netns.py: no netns-*.json files in %s (run bench/run_netns_compare.sh)" % directory)
    return runs


def rate_key(key):
    return (link_gbytes(key[0]), key[1])


def markdown(runs):
    out = []
    for key in sorted(runs, key=rate_key):
        rate, hosts = key
        link = link_gbytes(rate)
        by_streams = runs[key]
        k = 1 if 1 in by_streams else min(by_streams)
        rows, summary = by_streams[k]
        out.append("#### %s, %d hosts x 1 rank, %d TCP stream(s) per peer\n" % (rate, hosts, k))
        out.append("| size | libmwms busbw | Open MPI busbw | Gloo ring busbw | Gloo hd busbw | "
                   "libmwms / Open MPI | libmwms / Gloo best | libmwms / link |")
        out.append(table_rule(8))
        for r in rows:
            out.append("| %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.0f %% |" % (
                human_size(r["size"]), r["busbw"], r.get("mpi_busbw", 0), r.get("gloo_ring_busbw", 0),
                r.get("gloo_hd_busbw", 0), r.get("ratio", 0), r.get("gloo_ratio", 0),
                100 * r["busbw"] / link))
        out.append("")
        out.append("Link %.3f GB/s; %s; %s; %s.\n" % (
            link, summary.get("describe", "?"), summary.get("mpi_library", "?").split(",")[0],
            summary.get("gloo_library", "?")))
        if len(by_streams) > 1:
            counts = sorted(by_streams)
            out.append(table_row(["size"] + ["libmwms busbw, %d stream(s)" % c for c in counts] +
                                 ["Open MPI (run with %d)" % c for c in counts]))
            out.append(table_rule(1 + 2 * len(counts)))
            sizes = [r["size"] for r in by_streams[counts[0]][0]]
            for i, size in enumerate(sizes):
                cells = [human_size(size)]
                cells += ["%.3f" % by_streams[c][0][i]["busbw"] for c in counts]
                cells += ["%.3f" % by_streams[c][0][i].get("mpi_busbw", 0) for c in counts]
                out.append(table_row(cells))
            out.append("")
    out.append("busbw in GB/s (10^9 B/s); every ratio is taken within one run.")
    return "\n".join(out) + "\n"


def plot(runs, path):
    plt = pyplot("plot_netns.py")
    keys = sorted(runs, key=rate_key)
    cols = min(2, len(keys))
    nrows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        by_streams = runs[key]
        rows = by_streams[1 if 1 in by_streams else min(by_streams)][0]
        sizes = [r["size"] / 2**20 for r in rows]
        for label, field in (("libmwms", "busbw"), ("Open MPI (tcp)", "mpi_busbw"),
                             ("Gloo ring", "gloo_ring_busbw"), ("Gloo hd", "gloo_hd_busbw")):
            ax.plot(sizes, [r.get(field, 0) for r in rows], marker="o", label=label)
        for c in sorted(by_streams):
            if c != 1:
                ax.plot(sizes, [r["busbw"] for r in by_streams[c][0]], linestyle="--",
                        label="libmwms, %d streams" % c)
        ax.axhline(link_gbytes(key[0]), color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_title("%s, %d hosts" % key)
        ax.set_xlabel("size (MiB)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory")
    ap.add_argument("--markdown")
    ap.add_argument("--png")
    args = ap.parse_args()
    runs = load(args.directory)
    write_tables(markdown(runs), args.markdown)
    if args.png:
        plot(runs, args.png)


if __name__ == "__main__":
    main()
