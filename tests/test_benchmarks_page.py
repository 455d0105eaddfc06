"""The benchmarks page and its data file agree: every table of docs/benchmarks.md is the one in
bench/benchmarks.yaml, cell for cell and in order, each host a table names is one the page's host
table describes, and bench/plot_benchmarks.py draws the page's plots from the file (into a temp dir
here; the committed ones are in docs/images/ and shown on the page)."""

import importlib.util
import os
import re

import pytest

from tests.conftest import REPO


def plot_benchmarks():
    spec = importlib.util.spec_from_file_location("plot_benchmarks", os.path.join(REPO, "bench", "plot_benchmarks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return plot_benchmarks()


@pytest.fixture(scope="module")
def page():
    with open(os.path.join(REPO, "docs", "benchmarks.md"), encoding="utf-8") as f:
        return f.read()


def test_the_pages_tables_are_the_data_files(bench, page):
    tables = bench.load()
    assert len(tables) >= 30
    assert bench.mismatches(tables, page) == []


def test_a_changed_figure_is_found(bench, page):
    tables = bench.load()
    tables["suite"]["rows"][0][-1] += " and one second"
    (problem,) = bench.mismatches(tables, page)
    assert "'suite'" in problem and "and one second" in problem
    tables = bench.load()
    tables.pop("streaming")
    assert bench.mismatches(tables, page)  # a table of the page that the file lacks


def test_a_table_reads_back_as_written(bench):
    table = {"columns": ["change", "seed 1337", "kept"], "align": "lrl", "rows": [["none", "2.1772", ""]]}
    text = bench.markdown(table)
    assert text == "| change | seed 1337 | kept |\n|---|---:|---|\n| none | 2.1772 | |"
    assert bench.parse_table(text) == table
    with pytest.raises(ValueError):
        bench.markdown({**table, "rows": [["none", "2.1772"]]})


def test_figures_are_read_from_cells(bench):
    assert bench.number("**1.9862** (1.944-2.028)") == 1.9862 and bench.number("10,647 (beside light work)") == 10647
    assert bench.number("not recorded") is None
    assert bench.minutes("11m24s (16m39s in a slow hour)") == [11.4, 16.65]
    assert bench.minutes("about 23 minutes") == [23.0] and bench.minutes("8m13s-10m17s")[1] == 10 + 17 / 60
    assert bench.interval("**1.9862** (1.944-2.028)") == (1.944, 2.028)


def test_every_host_a_table_names_is_described(bench):
    tables = bench.load()
    hosts = {row[0] for row in tables["hosts"]["rows"]}
    for name, table in tables.items():
        if name in ("hosts", "suite") or "host" not in table["columns"]:  # the suite's table names hosts in full
            continue
        for row in bench.records(table):
            assert row["host"] in hosts | {"not recorded", ""}, (name, row["host"])


def test_the_page_shows_every_plot(bench, page):
    for name in bench.PLOTS:
        assert f"(images/{name})" in page, name
        assert os.path.getsize(os.path.join(REPO, "docs", "images", name)) > 10_000, name
    shown = re.findall(r"\(images/(bench-[^)]+\.png)\)", page)
    assert sorted(shown) == sorted(bench.PLOTS)


@pytest.mark.slow
def test_the_script_draws_every_plot(bench, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra: pip install -e '.[plot]'")
    assert bench.main(["--out", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(bench.PLOTS)
    for name in bench.PLOTS:
        with open(tmp_path / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert bench.main(["--check"]) == 0
