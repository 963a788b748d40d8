"""What bench/plot_performance.py and bench/plot_netns.py share: reading one --json file of a
*_perf tool, markdown table lines, sizes written as the tables write them, matplotlib imported with
a message saying how to get it, and the tables written to a file or printed.

Imported by those two scripts (they sit beside it, so `import perf_tables` finds it when either is
run as bench/plot_*.py); it runs nothing itself.
"""

import sys


def human_size(n):
    """n bytes as the tables write a size: "4 KiB", "1 MiB" for exact multiples, else "12 B"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def read_run(path, untagged_is_row=True):
    """(rows, summary) of one --json file: its "row" records in order and its "summary" record
    ({} when it has none). A record without a "record" field counts as a row when
    `untagged_is_row` (files from before the field existed), and is skipped otherwise."""
    import json
    with open(path) as f:
        records = json.load(f)
    default = "row" if untagged_is_row else None
    rows = [r for r in records if r.get("record", default) == "row"]
    summary = next((r for r in records if r.get("record") == "summary"), {})
    return rows, summary


def table_row(cells):
    """One markdown table line: "| a | b | c |"."""
    return "| " + " | ".join(cells) + " |"


def table_rule(columns):
    """The markdown line under a header of `columns` right-aligned columns: "|---:|---:|"."""
    return "|" + "---:|" * columns


def pyplot(script):
    """matplotlib.pyplot on the Agg backend (PNG files, no display); exits naming `script` and how
    to install matplotlib when it is missing (only the --png option needs it)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("%s: --png needs matplotlib, which is not installed "
                 "for %s (Debian/Ubuntu: apt-get install python3-matplotlib, then run this script "
                 "with /usr/bin/python3; or pip install matplotlib). The markdown tables need "
                 "nothing beyond Python." % (script, sys.executable))
    return plt


def write_tables(text, path):
    """Writes `text` to `path`, or to stdout when `path` is None."""
    if path:
        with open(path, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
