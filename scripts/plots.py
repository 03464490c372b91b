#!/usr/bin/env python3
"""Renders the figures of docs/benchmarks.md as PNG charts from the JSON the
benchmarks write:

  peers.json          bench/peers/run.sh      peers-throughput.png, peers-latency.png
  engine-memory.json  bench/engine_sizes.sh   engine-memory.png
  scenario-caps.json  scenarios/run --json    scenario-caps.png

  python3 scripts/plots.py [--data docs/data] [--out docs/plots]

Each input found in --data gives its charts in --out; an input that is
missing is skipped (and said so), and none at all is an error. Every chart
names the command, commit and date of its JSON. The same JSON gives the
same bytes: fixed size and resolution, no time or software version in the
PNG's metadata. A file that is not valid JSON, or lacks a field a chart
needs, fails the run with a message naming the file (exit status 1).

Needs matplotlib: Debian's python3-matplotlib (scripts/install-deps.sh),
which is installed for /usr/bin/python3. When another python3 comes first
on PATH (pyenv, a virtualenv) and lacks it, the script runs itself again
under /usr/bin/python3.
"""

import argparse
import json
import math
import os
import sys
import textwrap

SYSTEM_PYTHON = "/usr/bin/python3"

try:
    import matplotlib
except ImportError:
    if (os.path.exists(SYSTEM_PYTHON)
            and os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON)
            and "TIDEMARK_PLOTS_REEXEC" not in os.environ):
        os.environ["TIDEMARK_PLOTS_REEXEC"] = "1"
        os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    sys.exit("plots.py: matplotlib is not installed for %s (Debian: apt-get install "
             "python3-matplotlib, or scripts/install-deps.sh)" % sys.executable)

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402 (after choosing the backend)
from matplotlib.ticker import FuncFormatter  # noqa: E402

# Every chart's pixel size is its inches times DPI; tests/plots_test.py
# checks them.
DPI = 100
SIZES = {
    "peers-throughput.png": (10.0, 5.6),
    "peers-latency.png": (11.0, 5.6),
    "engine-memory.png": (10.0, 4.8),
    "scenario-caps.png": (10.0, 5.2),
}
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
          "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


class InputError(Exception):
    """A JSON file that cannot be charted; the message names the file."""


# ---- Reading the JSON, with errors that say what is wrong where


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("%s: cannot read: %s" % (path, e))
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError("%s: not valid JSON: %s" % (path, e))


def field(obj, name, kind, where, optional=False):
    """obj[name], checked to be of `kind` (a type or tuple of types)."""
    if not isinstance(obj, dict):
        raise InputError("%s: expected an object" % where)
    if name not in obj or obj[name] is None:
        if optional:
            return None
        raise InputError("%s: no \"%s\"" % (where, name))
    value = obj[name]
    if kind in (int, float, (int, float)) and isinstance(value, bool):
        raise InputError("%s: \"%s\" is not a number" % (where, name))
    if not isinstance(value, kind):
        names = {list: "a list", dict: "an object", str: "a string", int: "an integer"}
        raise InputError("%s: \"%s\" is not %s" % (where, name, names.get(kind, "a number")))
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError("%s: \"%s\" is not a finite number" % (where, name))
    return value


def load_runs(path):
    """The document at `path` and its non-empty "runs" list."""
    doc = load(path)
    runs = field(doc, "runs", list, path)
    if not runs:
        raise InputError("%s: \"runs\" is empty" % path)
    return doc, runs


NUMBER = (int, float)


def provenance(doc, path):
    """The caption: the command that produced the JSON, its commit and date."""
    command = field(doc, "command", str, path)
    commit = field(doc, "commit", str, path, optional=True) or "commit unknown"
    date = field(doc, "date", str, path)
    line = "%s  (at %s, %s)" % (command, commit, date.split("T")[0])
    return "\n".join(textwrap.wrap(line, 180))


# ---- Drawing


def new_figure(name, panels=1, sharey=False):
    fig = Figure(figsize=SIZES[name], dpi=DPI, layout="constrained")
    axes = fig.subplots(1, panels, sharey=sharey, squeeze=False)[0]
    return fig, list(axes)


def save(fig, caption, out_dir, name):
    fig.supxlabel(caption, fontsize=8, color="#444444")
    path = os.path.join(out_dir, name)
    # No "Software" entry (matplotlib's version) and no time: the same
    # JSON gives the same file.
    fig.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    width, height = (round(v * DPI) for v in SIZES[name])
    print("plots.py: wrote %s (%dx%d)" % (path, width, height))


def short_number(v):
    if v >= 10_000:
        return "%.0fk" % (v / 1000)
    if v >= 1_000:
        return "%.1fk" % (v / 1000)
    return "%.0f" % v


def median(values):
    s = sorted(values)
    return s[len(s) // 2]  # as bench/peers/peers.cc: the upper middle


def ms_label(v, _):
    return ("%g" % v) if v >= 0.01 else ("%.3f" % v)


# ---- bench/peers/run.sh


def read_peers(path):
    doc = load(path)
    rows = field(doc, "rows", list, path)
    if not rows:
        raise InputError("%s: \"rows\" is empty" % path)
    table = {}  # (system, clients) -> list of rows
    seen_systems, seen_clients = [], []
    for i, row in enumerate(rows):
        where = "%s: rows[%d]" % (path, i)
        system = field(row, "system", str, where)
        clients = field(row, "clients", int, where)
        entry = {k: field(row, k, NUMBER, where) for k in ("records_per_s", "p50_ms", "p99_ms")}
        table.setdefault((system, clients), []).append(entry)
        if system not in seen_systems:
            seen_systems.append(system)
        if clients not in seen_clients:
            seen_clients.append(clients)
    systems = field(doc, "systems", list, path, optional=True) or seen_systems
    systems = [s for s in systems if s in seen_systems]
    clients = sorted(seen_clients)
    rounds = field(doc, "rounds", int, path, optional=True)
    return doc, table, systems, clients, rounds


def summary(table, system, clients, key):
    values = [r[key] for r in table.get((system, clients), [])]
    if not values:
        return None
    return median(values), min(values), max(values)


def peers_charts(path, out_dir):
    doc, table, systems, clients, rounds = read_peers(path)
    caption = provenance(doc, path)
    of_rounds = "median of %d rounds" % rounds if rounds else "median of the rounds"

    name = "peers-throughput.png"
    fig, (ax,) = new_figure(name)
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        xs, heights, low, high = [], [], [], []
        for g, c in enumerate(clients):
            s = summary(table, system, c, "records_per_s")
            if s is None:
                continue
            xs.append(g - 0.4 + width * (i + 0.5))
            heights.append(s[0])
            low.append(s[0] - s[1])
            high.append(s[2] - s[0])
        bars = ax.bar(xs, heights, width * 0.9, color=COLORS[i % len(COLORS)], label=system,
                      yerr=[low, high], error_kw={"elinewidth": 0.8, "capsize": 2})
        for bar, h, up in zip(bars, heights, high):
            ax.annotate(short_number(h), (bar.get_x() + bar.get_width() / 2, h + up),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=7, rotation=90)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%gk" % (v / 1000) if v >= 1000
                                               else "%g" % v))
    # Bars start at a power of ten below the lowest round, and there is
    # room above the highest for the labels.
    lowest = min(r["records_per_s"] for rows in table.values() for r in rows)
    ax.set_ylim(10 ** math.floor(math.log10(max(lowest, 1) * 0.9)), ax.get_ylim()[1] * 4)
    ax.set_xticks(range(len(clients)))
    ax.set_xticklabels(["%d client%s" % (c, "" if c == 1 else "s") for c in clients])
    ax.set_ylabel("acknowledged durable writes per second (log)")
    ax.set_title("Durable writes: records/s, %s (whiskers: lowest and highest round)" % of_rounds)
    ax.grid(axis="y", which="major", color="#dddddd")
    ax.set_axisbelow(True)
    ax.legend(ncol=min(len(systems), 6), fontsize=8, loc="upper center", frameon=False)
    save(fig, caption, out_dir, name)

    name = "peers-latency.png"
    fig, axes = new_figure(name, panels=2, sharey=True)
    for ax, key, label in ((axes[0], "p50_ms", "p50"), (axes[1], "p99_ms", "p99")):
        for i, system in enumerate(systems):
            xs, ys, low, high = [], [], [], []
            for g, c in enumerate(clients):
                s = summary(table, system, c, key)
                if s is None:
                    continue
                # Systems side by side within a concurrency, so whiskers
                # do not hide each other.
                xs.append(g + (i - (len(systems) - 1) / 2) * 0.06)
                ys.append(s[0])
                low.append(s[0] - s[1])
                high.append(s[2] - s[0])
            ax.errorbar(xs, ys, yerr=[low, high], color=COLORS[i % len(COLORS)], marker="o",
                        markersize=4, linewidth=1.2, capsize=2, elinewidth=0.8, label=system)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(ms_label))
        ax.set_xticks(range(len(clients)))
        ax.set_xticklabels(["%d client%s" % (c, "" if c == 1 else "s") for c in clients])
        ax.set_xlim(-0.5, len(clients) - 0.5)
        ax.set_title("%s latency, ms (log): %s" % (label, of_rounds))
        ax.grid(axis="y", which="both", color="#eeeeee")
        ax.set_axisbelow(True)
    axes[0].set_ylabel("request to acknowledgement, ms (whiskers: lowest and highest round)",
                       fontsize=9)
    axes[0].legend(fontsize=8, loc="upper left", frameon=False)
    save(fig, caption, out_dir, name)


# ---- bench/engine_sizes.sh


def engine_chart(path, out_dir):
    doc, runs = load_runs(path)
    points = []
    for i, run in enumerate(runs):
        where = "%s: runs[%d]" % (path, i)
        updates = field(run, "updates", int, where)
        result = field(run, "result", dict, where)
        where += ".result"
        points.append((updates,
                       field(result, "snapshot_peak_rss_mib", NUMBER, where),
                       field(result, "snapshot_updates_per_s", NUMBER, where),
                       field(result, "snapshot_updates_per_cpu_s", NUMBER, where, optional=True)))
    points.sort()
    aims = field(doc, "aims", dict, path, optional=True) or {}
    caption = provenance(doc, path)

    name = "engine-memory.png"
    fig, (left, right) = new_figure(name, panels=2)
    xs = [p[0] for p in points]
    ticks = lambda v, _: ("%g M" % (v / 1e6)) if v >= 1e6 else short_number(v)  # noqa: E731

    rss = [p[1] for p in points]
    left.plot(xs, rss, marker="o", color=COLORS[0], label="peak RSS of the snapshot process")
    for x, y in zip(xs, rss):
        left.annotate("%.1f MiB" % y, (x, y), xytext=(0, 6), textcoords="offset points",
                      ha="center", fontsize=8)
    aim = aims.get("snapshot_peak_rss_mib")
    if isinstance(aim, NUMBER) and not isinstance(aim, bool):
        left.axhline(aim, color="#999999", linestyle="--", linewidth=1,
                     label="aim: %g MiB at 10 M updates" % aim)
    left.set_ylim(0, max(rss + [aim if isinstance(aim, NUMBER) else 0]) * 1.2)
    left.set_title("Snapshot peak RSS (VmHWM), MiB")
    left.set_ylabel("MiB")

    rate = [p[2] / 1e6 for p in points]
    right.plot(xs, rate, marker="o", color=COLORS[1], label="updates/s (wall clock)")
    for x, y in zip(xs, rate):
        right.annotate("%.2f M" % y, (x, y), xytext=(0, -14), textcoords="offset points",
                       ha="center", fontsize=8)
    if all(p[3] is not None for p in points):
        right.plot(xs, [p[3] / 1e6 for p in points], marker="s", linestyle=":",
                   color=COLORS[2], label="updates per CPU second")
    aim = aims.get("snapshot_updates_per_s")
    if isinstance(aim, NUMBER) and not isinstance(aim, bool):
        right.axhline(aim / 1e6, color="#999999", linestyle="--", linewidth=1,
                      label="aim: %g M/s on one core" % (aim / 1e6))
    right.set_ylim(0, max(rate + [aim / 1e6 if isinstance(aim, NUMBER) else 0]) * 1.3)
    right.set_title("Snapshot rate, million updates/s (median of 3)")
    right.set_ylabel("M updates/s")

    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(FuncFormatter(ticks))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xlabel("updates in the shard (log)")
        ax.grid(color="#eeeeee")
        ax.set_axisbelow(True)
        ax.legend(fontsize=8, loc="lower right", frameon=False)
    save(fig, caption, out_dir, name)


# ---- scenarios/run --json


def scenarios_chart(path, out_dir):
    doc, runs = load_runs(path)
    bars = []
    for i, run in enumerate(runs):
        where = "%s: runs[%d]" % (path, i)
        bars.append({
            "scenario": field(run, "scenario", str, where),
            "result": field(run, "result", str, where),
            "peak": field(run, "peak_rss_mib", NUMBER, where),
            "cap": field(run, "cap_mib", NUMBER, where),
            "seconds": field(run, "seconds", NUMBER, where),
        })
    seed = field(doc, "seed", int, path, optional=True)
    not_run = field(doc, "not_run", list, path, optional=True) or []
    caption = provenance(doc, path)

    name = "scenario-caps.png"
    fig, (ax,) = new_figure(name)
    names = [b["scenario"] for b in bars]
    labels = []
    for b in bars:
        label = b["scenario"]
        if names.count(b["scenario"]) > 1:  # a --search run: one bar per cap
            label += " @ %g MiB" % b["cap"]
        labels.append(label)
    ys = list(range(len(bars)))[::-1]  # the first run on top
    colors = ["#2ca02c" if b["result"] == "pass" else "#d62728" for b in bars]
    # The cap as an outlined bar behind the peak: how much of it was used.
    ax.barh(ys, [b["cap"] for b in bars], 0.7, color="#f2f2f2", edgecolor="#555555",
            linewidth=1, label="memory cap")
    ax.barh(ys, [b["peak"] for b in bars], 0.5, color=colors, label="peak RSS (green: pass)")
    top = max(max(b["cap"] for b in bars), max(b["peak"] for b in bars))
    for y, b in zip(ys, bars):
        ax.annotate("%s: %.1f of %g MiB, %.0f s" % (b["result"], b["peak"], b["cap"],
                                                     b["seconds"]),
                    (max(b["peak"], b["cap"]), y), xytext=(5, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels)
    ax.set_xlim(0, top * 1.4)
    ax.set_xlabel("MiB: the server's peak RSS (VmHWM, all its incarnations) inside its memory cap")
    ax.legend(fontsize=8, loc="upper right", frameon=False)
    title = "Bounded-memory scenarios: peak RSS under the cap"
    if seed is not None:
        title += ", seed %d" % seed
    ax.set_title(title)
    if not_run:
        ax.text(0.99, 0.02, "not run: " + ", ".join(str(n) for n in not_run),
                transform=ax.transAxes, ha="right", va="bottom", fontsize=8, color="#444444")
    ax.grid(axis="x", color="#eeeeee")
    ax.set_axisbelow(True)
    save(fig, caption, out_dir, name)


# ---- Command line

INPUTS = [
    ("peers.json", peers_charts),
    ("engine-memory.json", engine_chart),
    ("scenario-caps.json", scenarios_chart),
]


def main(argv):
    parser = argparse.ArgumentParser(
        prog="plots.py", description="Render docs/benchmarks.md's charts from the benchmarks' JSON.")
    parser.add_argument("--data", default="docs/data", help="folder of the JSON inputs")
    parser.add_argument("--out", default="docs/plots", help="folder for the PNG charts")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data):
        print("plots.py: %s: no such folder" % args.data, file=sys.stderr)
        return 1
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        print("plots.py: %s: cannot make the folder: %s" % (args.out, e), file=sys.stderr)
        return 1
    found = 0
    failed = False
    for file_name, chart in INPUTS:
        path = os.path.join(args.data, file_name)
        if not os.path.exists(path):
            print("plots.py: %s: absent, its charts skipped" % path, file=sys.stderr)
            continue
        found += 1
        try:
            chart(path, args.out)
        except InputError as e:
            print("plots.py: %s" % e, file=sys.stderr)
            failed = True
        except OSError as e:  # writing a chart
            print("plots.py: %s: %s" % (path, e), file=sys.stderr)
            failed = True
    if found == 0:
        print("plots.py: %s: none of %s" % (args.data, ", ".join(n for n, _ in INPUTS)),
              file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
