"""The benchmarks page's tables and plots from one data file, ``bench/benchmarks.yaml``.

    python bench/plot_benchmarks.py                  # the page's plots into docs/images/
    python bench/plot_benchmarks.py --out DIR        # elsewhere
    python bench/plot_benchmarks.py --check          # does docs/benchmarks.md hold the file's tables?
    python bench/plot_benchmarks.py --table suite    # one table as the page writes it

The data file holds every table of docs/benchmarks.md in the page's order: its columns, its
alignment (``l`` for ``---``, ``r`` for ``---:``) and its rows, each cell the page's text (a figure
with its notes, "not recorded" where nothing was written down). ``markdown`` writes a table as the
page holds it, so the page's tables and the file agree cell for cell (tests/test_benchmarks_page.py);
the plots read their figures from the same cells (``number``, ``minutes``): the main job by recipe
and host, the test suite's time, streaming by band of positions and the shipped layer designs'
perplexity by length. Nothing is measured here: the figures come from the bench scripts and the
main job, with their hosts, as the page says.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from minilm.figures.canvas import require_matplotlib, save_figure  # noqa: E402

DATA = os.path.join(REPO, "bench", "benchmarks.yaml")
PAGE = os.path.join(REPO, "docs", "benchmarks.md")
IMAGES = os.path.join(REPO, "docs", "images")
SEPARATOR = {"l": "---", "r": "---:"}
HOST_STYLES = {  # a host's name in the tables -> colour and marker on every plot
    "AVX2 EPYC": ("tab:red", "v"),
    "BF16 EPYC": ("tab:blue", "o"),
    "EPYC 25": ("tab:cyan", "s"),
    "EPYC 26": ("tab:green", "D"),
    "Xeon": ("tab:purple", "^"),
    "not recorded": ("tab:gray", "x"),
}


def load(path: str = DATA) -> dict:
    """The tables by name, in the page's order: {name: {columns, align, rows}}."""
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def markdown(table: dict) -> str:
    """A table as docs/benchmarks.md writes it: one line a row, an empty cell as ``| |``."""

    def line(cells):
        return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"

    if len(table["align"]) != len(table["columns"]) or any(len(row) != len(table["columns"]) for row in table["rows"]):
        raise ValueError(f"a table whose rows or alignment do not match its {len(table['columns'])} columns")
    return "\n".join(
        [line(table["columns"]), "|" + "|".join(SEPARATOR[a] for a in table["align"]) + "|"]
        + [line(row) for row in table["rows"]]
    )


def page_tables(text: str) -> list:
    """Every table of a markdown page, as its lines joined: runs of lines that start with ``|``."""
    tables, current = [], []
    for line in text.split("\n") + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append("\n".join(current))
            current = []
    return tables


def parse_table(text: str) -> dict:
    """The inverse of ``markdown``: a page's table as columns, alignment and rows of cells."""
    rows = [[cell.strip() for cell in line.strip()[1:-1].split("|")] for line in text.split("\n")]
    align = "".join("r" if cell.endswith(":") else "l" for cell in rows[1])
    return {"columns": rows[0], "align": align, "rows": rows[2:]}


def mismatches(tables: dict, page_text: str) -> list:
    """What differs between the data file's tables and the page's, in order; empty when they agree."""
    ours, theirs = [markdown(t) for t in tables.values()], page_tables(page_text)
    problems = [
        f"table {name!r} differs from the page's table {i + 1}:\n  file: {a.splitlines()}\n  page: {b.splitlines()}"
        for i, (name, a, b) in enumerate(zip(tables, ours, theirs))
        if a != b
    ]
    if len(ours) != len(theirs):
        problems.append(f"the file holds {len(ours)} tables, the page {len(theirs)}")
    return problems


def records(table: dict) -> list:
    """A table's rows as {column: cell}."""
    return [dict(zip(table["columns"], row)) for row in table["rows"]]


def number(cell: str):
    """The first figure of a cell (``**1.9862** (1.944-2.028)`` -> 1.9862), or None."""
    found = re.search(r"-?\d[\d,]*(?:\.\d+)?", cell.replace("**", ""))
    return float(found.group(0).replace(",", "")) if found else None


def minutes(cell: str) -> list:
    """Every time of a cell in minutes, in order: ``11m24s (16m39s ...)`` -> [11.4, 16.65]; ``about 23
    min(utes)`` -> [23.0]; ``8m52s-9m52s`` -> both ends."""
    times = [int(m) + int(s) / 60 for m, s in re.findall(r"(\d+)m(\d+)s", cell)]
    return times or [float(x) for x in re.findall(r"about ([\d.]+) min", cell)]


def interval(cell: str):
    """The (low, high) of a ``1.944-2.028`` in a cell, or None."""
    found = re.search(r"(\d+\.\d+)-(\d+\.\d+)", cell)
    return (float(found.group(1)), float(found.group(2))) if found else None


def host_style(host: str):
    return HOST_STYLES.get(host, HOST_STYLES["not recorded"])


def plot_main_job(tables: dict, path: str) -> str:
    """Left: seed 1337's held-out bits/char by recipe (oldest first) and host, and the mean over the
    seeds (with its 95% interval where measured); right: the wall time, an estimate hollow. The
    shipped recipe's runs by host are the last recipe's."""
    Figure = require_matplotlib()
    recipes = records(tables["main-job-recipes"])
    names = list(dict.fromkeys(r["recipe"] for r in recipes))
    x = {name: i for i, name in enumerate(names)}
    shipped = names[-1]  # the by-host table's runs are of the configs now: the last recipe
    runs = [(r["recipe"], r) for r in recipes]
    runs += [(shipped, r) for r in records(tables["main-job-by-host"]) if r["date"] != "(estimate)"]
    hosts = list(HOST_STYLES)
    fig = Figure(figsize=(12, 5.8))
    left, right = fig.subplots(1, 2)
    labelled = set()

    def label(name):
        if name in labelled:
            return None
        labelled.add(name)
        return name if name != "not recorded" else "host not recorded"

    for recipe, r in runs:
        color, marker = host_style(r["host"])
        at = x[recipe] + 0.08 * (hosts.index(r["host"]) - 2 if r["host"] in hosts else 0)
        left.plot(at, number(r["held-out bits/char"]), marker, color=color, label=label(r["host"]), ms=7)
        for t in minutes(r["wall time"])[:2]:
            right.plot(at, t, marker, color=color, ms=7)
    for r in records(tables["main-job-seeds"]):
        if r["recipe"] not in x or number(r["mean"]) is None:
            continue
        mean, bounds = number(r["mean"]), interval(r["95% interval"])
        errors = [[mean - bounds[0]], [bounds[1] - mean]] if bounds else None
        left.errorbar(
            x[r["recipe"]] + 0.3,
            mean,
            yerr=errors,
            fmt="_",
            color="black",
            capsize=4,
            ms=12,
            label=label("mean over the seeds (95% interval where measured)"),
        )
    for r in records(tables["main-job-avx2-estimates"]):
        if r["recipe"] in x:
            color, marker = host_style(r["host"])
            right.plot(x[r["recipe"]], minutes(r["estimate"])[0], marker, color=color, mfc="none", ms=9)
    left.axhline(2.0, color="gray", lw=0.8, ls="--")
    left.text(-0.3, 2.002, "2.00, the recipe's aim", ha="left", va="bottom", fontsize=8, color="gray")
    right.axhline(15, color="gray", lw=0.8, ls="--")
    right.text(-0.3, 15.2, "15 minutes", ha="left", va="bottom", fontsize=8, color="gray")
    left.set_ylabel("held-out bits/char (seed 1337)")
    right.set_ylabel("wall time, minutes (hollow: an estimate)")
    for ax in (left, right):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=55, ha="right", fontsize=8)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8, loc="upper right")
    left.set_title("The main job by recipe, oldest first, and by host", fontsize=10)
    right.set_title("Its wall time", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def suite_host(host: str, previous: str) -> str:
    """A short name for the suite table's host cell ("the same" is the row above's)."""
    if host.startswith("the same"):
        return previous
    for pattern, name in (
        ("Xeon", "Xeon"),
        ("family 26", "EPYC 26"),
        ("family 25", "EPYC 25"),
        ("AVX2-only", "AVX2 EPYC"),
    ):
        if pattern in host:
            return name
    return "not recorded"


def plot_suite(tables: dict, path: str) -> str:
    """The suite's time on each row of its table (newest at the top), by host; a range as a line."""
    Figure = require_matplotlib()
    rows = records(tables["suite"])
    fig = Figure(figsize=(9, 0.5 * len(rows) + 1.6))
    ax = fig.subplots()
    host, labels, seen = None, [], set()
    for i, r in enumerate(rows):
        host = suite_host(r["host"], host)
        color, _ = host_style(host)
        processes = "2 processes" if "2 processes" in r["host"] else "1 process"
        first = r["time"].split(" ")[0]  # the time itself: 6m35s, or a range 8m13s-10m17s
        times = minutes(first)
        y = len(rows) - 1 - i
        ax.barh(y, times[0], color=color, alpha=0.8, label=host if host not in seen else None)
        seen.add(host)
        if len(times) > 1:  # a range: the bar to its low end, a line on to its high end
            ax.plot([times[0], times[1]], [y, y], color=color, lw=3)
        ax.text(times[-1] + 0.2, y, f"{first}, {r['tests']} tests, {processes}", va="center", fontsize=8)
        labels.append(f"{r['date']} {r['commit']}".strip())
    ax.axvline(10, color="gray", lw=0.8, ls="--")
    ax.text(10.1, len(rows) - 0.55, "10 minutes", fontsize=8, color="gray", va="bottom")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels[::-1], fontsize=8)
    ax.set_xlabel("minutes (bash .ci/run from a fresh clone, without the install)")
    ax.set_xlim(0, 24)
    ax.set_ylim(-0.6, len(rows) - 0.1)
    ax.set_title("The test suite's time", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def finished(fig, ax, path: str) -> str:
    """``fig`` with ``ax``'s legend and grid, laid out and written to ``path`` (its path)."""
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_streaming(tables: dict, path: str) -> str:
    """Nats a token by band of positions for each attention of the streaming table."""
    Figure = require_matplotlib()
    table = tables["streaming"]
    bands = [c for c in table["columns"] if re.match(r"^[\d,]+-[\d,]+$", c)]
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for r in records(table):
        ax.plot(range(len(bands)), [number(r[b]) for b in bands], marker="o", label=r["attention"])
    ax.set_xticks(range(len(bands)))
    ax.set_xticklabels(bands)
    ax.set_xlabel("positions")
    ax.set_ylabel("nats a token")
    ax.set_title("Streaming: full attention against a window of 256 and sinks", fontsize=10)
    return finished(fig, ax, path)


def plot_layer_designs(tables: dict, path: str) -> str:
    """Perplexity against evaluation length for the shipped layer designs (log2 length axis)."""
    Figure = require_matplotlib()
    table = tables["layers-designs"]
    columns = [c for c in table["columns"] if c.startswith("ppl @") or re.match(r"^@ \d+", c)]
    lengths = [int(re.search(r"@ (\d+)", c).group(1)) for c in columns]
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for r in records(table):
        ax.plot(lengths, [number(r[c]) for c in columns], marker="o", label=r["config"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(n) for n in lengths])
    ax.set_xlabel("evaluation length (trained at 256)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("Positions per layer: the shipped designs (seed 1337)", fontsize=10)
    return finished(fig, ax, path)


PLOTS = {
    "bench-main-job.png": plot_main_job,
    "bench-suite.png": plot_suite,
    "bench-streaming.png": plot_streaming,
    "bench-layer-designs.png": plot_layer_designs,
}


def draw(tables: dict, out_dir: str) -> list:
    """Every plot of the page into ``out_dir``; the paths written."""
    return [plot(tables, os.path.join(out_dir, name)) for name, plot in PLOTS.items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=DATA, help="the tables (default: bench/benchmarks.yaml)")
    parser.add_argument("--out", default=IMAGES, help="where the PNGs go (default: docs/images)")
    parser.add_argument("--check", action="store_true", help="compare the file's tables with docs/benchmarks.md")
    parser.add_argument("--table", help="print one table as the page writes it, and draw nothing")
    args = parser.parse_args(argv)
    tables = load(args.data)
    if args.table:
        if args.table not in tables:
            parser.error(f"no table {args.table!r}; valid: {', '.join(tables)}")
        print(markdown(tables[args.table]))
        return 0
    if args.check:
        with open(PAGE, encoding="utf-8") as f:
            problems = mismatches(tables, f.read())
        print("\n".join(problems) or f"docs/benchmarks.md holds the file's {len(tables)} tables")
        return 1 if problems else 0
    for path in draw(tables, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
