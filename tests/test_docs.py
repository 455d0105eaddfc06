"""README.md and the manual cannot rot: every shell command in them runs (with ``MINILM_SMOKE=1``, so
training takes seconds), the site builds with ``mkdocs build --strict`` (a broken link or a page left
out of the nav fails it), and README stays a front door of at most 200 lines."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO
from tests.docs_commands import prepare_base, run_page, shell_commands, skip_reason

SUMMARY = []  # printed at the end of the run by conftest's terminal summary


def nav_pages() -> list:
    """The manual's pages in the order of mkdocs.yml's nav."""
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        nav = yaml.safe_load(f)["nav"]
    pages = []

    def walk(entry):
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)

    walk(nav)
    return pages


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The main job as a smoke run, which every page's sandbox starts from."""
    path = str(tmp_path_factory.mktemp("docs") / "base")
    prepare_base(path)
    return path


PAGES = ["README.md"] + [os.path.join("docs", page) for page in nav_pages()]


def page_commands(page: str) -> list:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return shell_commands(f.read())


def test_every_page_of_docs_is_in_the_nav():
    on_disk = {
        os.path.relpath(os.path.join(root, name), os.path.join(REPO, "docs"))
        for root, _, files in os.walk(os.path.join(REPO, "docs"))
        for name in files
        if name.endswith(".md")
    }
    assert on_disk == set(nav_pages())


def test_readme_is_a_front_door():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) <= 200
    commands = shell_commands(text)
    main_job, tests = "pip install -e . && python train.py --config rope.yaml", 'pip install -e ".[test]" && pytest'
    assert main_job in commands and tests in commands  # the two commands
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        assert f.read().rstrip().endswith(tests)  # what CI runs


@pytest.mark.slow
def test_every_shell_command_of_readme_and_the_manual_runs(base, tmp_path):
    """Every page's commands in order, in a sandbox of its own, in two runners at once."""
    started = time.time()
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    lists = [[], []]  # two runners, balanced by their count of commands
    for page in sorted(PAGES, key=lambda page: -len(page_commands(page))):
        min(lists, key=lambda pages: sum(len(page_commands(p)) for p in pages)).append(page)
    runners = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.docs_commands", base, str(tmp_path), *pages],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for pages in lists
    ]
    results = {}
    for runner in runners:
        out, _ = runner.communicate(timeout=1200)
        assert runner.returncode == 0, "a runner failed:\n" + out[-3000:]
        for line in out.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
                results[result.pop("page")] = result
    assert sorted(results) == sorted(PAGES)
    ran = sum(len(r["ran"]) for r in results.values())
    skipped = [s for r in results.values() for s in r["skipped"]]
    failed = [(page, *f) for page, r in results.items() for f in r["failed"]]
    reasons = sorted({reason for _, reason in skipped})
    SUMMARY.append(
        f"docs commands: {ran + len(skipped) + len(failed)} in README.md and {len(PAGES) - 1} pages of docs/: "
        f"{ran} ran, {len(failed)} failed, {len(skipped)} skipped ({time.time() - started:.0f} s)"
    )
    slowest = sorted(results, key=lambda page: -results[page]["seconds"])[:3]
    SUMMARY.append("  slowest pages: " + ", ".join(f"{page} {results[page]['seconds']:.0f} s" for page in slowest))
    SUMMARY.extend(f"  skipped, {reason}: {sum(r == reason for _, r in skipped)}" for reason in reasons)
    assert not failed, "\n\n".join(
        f"{page}: `{command}` exited {status}:\n{tail}" for page, command, status, tail in failed
    )


@pytest.mark.slow
def test_the_runner_fails_on_a_broken_command_and_counts_what_it_skips(base, tmp_path):
    """The check itself can fail: a command that exits non-zero is reported with its output."""
    page = "\n".join(
        [
            "```bash",
            "minilm positions list            # runs",
            "pip install -e . && minilm evaluate out/rope --lengths 64 \\",
            "    --quiet",
            "minilm train --config no-such.yaml",
            "python bench/bench_train.py",
            "```",
        ]
    )
    result = run_page(page, str(tmp_path / "page"), base)
    assert result["ran"] == [
        "minilm positions list",
        "pip install -e . && minilm evaluate out/rope --lengths 64 --quiet",
    ]
    assert [c for c, _ in result["skipped"]] == ["python bench/bench_train.py"]
    ((command, status, output),) = result["failed"]
    assert command == "minilm train --config no-such.yaml" and status == 2 and "no-such.yaml" in output


def test_commands_are_found_in_every_kind_of_shell_block():
    page = (
        "text\n\n  ```bash\n  a --x \\\n      --y  # note\n  # only a comment\n  ```\n"
        "```python\nnot = 1\n```\n```sh\nb\n```\n"
    )
    assert shell_commands(page) == ["a --x --y", "b"]
    assert skip_reason("pip install -e '.[hf]'") and not skip_reason("minilm train --config rope.yaml")


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    config_page = (tmp_path / "site" / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    from minilm.config import config_keys

    assert all(f"<code>{key}</code>" in config_page for key, *_ in config_keys())  # generated: none left out
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()
    # the formulas need no network: MathML written at build time, no TeX left for a script, no script from afar
    formulas = (tmp_path / "site" / "concepts" / "positions" / "index.html").read_text(encoding="utf-8")
    assert formulas.count("<math ") >= 50 and 'MathML" display="block"' in formulas  # inline and displayed
    for page in (tmp_path / "site").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert 'class="arithmatex"' not in text, page  # every formula converted
        for formula in re.findall(r"<math .*?</math>", text, flags=re.S):  # no command left as text
            shown = re.sub(r"<[^>]+>", "", formula)
            assert "\\" not in shown and not re.search(r"\[[\d.]+(pt|em|ex|mm)\]", shown), (page, formula)
        assert not re.search(r"<script[^>]*\ssrc=[\"']?(https?:)?//", text), page


def test_the_reading_tour_counts_what_the_files_hold():
    """Each stop's line count, the total and the package's size, within 5% of the files as they are."""
    with open(os.path.join(REPO, "docs", "reading-tour.md"), encoding="utf-8") as f:
        text = f.read()

    def count(path):
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            return sum(1 for _ in f)

    rows = re.findall(r"^\| \d* \| `(minilm/[^`]+\.py)`[^|]*\| (\d+) \|", text, flags=re.M)
    assert len(rows) >= 10
    for path, said in rows:
        assert abs(int(said) - count(path)) <= 0.05 * count(path), (path, said, count(path))
    total = int(re.search(r"^\| \| total \| (\d+) \|", text, flags=re.M).group(1))
    assert total == sum(int(said) for _, said in rows)
    files, lines = re.search(r"are (\d+) files and ([\d,]+) lines", text).groups()  # the introduction's sum
    assert (int(files), int(lines.replace(",", ""))) == (len(rows), total)
    package = sum(
        count(os.path.relpath(os.path.join(root, name), REPO))
        for root, _, files in os.walk(os.path.join(REPO, "minilm"))
        for name in files
        if name.endswith(".py")
    )
    said_package = int(re.search(r"about ([\d,]+) lines of Python", text).group(1).replace(",", ""))
    assert abs(said_package - package) <= 0.05 * package
    # "line N (`def name`)" points into the file named last before it: that line defines the name
    pointers = re.findall(r"`(minilm/[^`]+\.py)`(?:(?!`minilm/).)*?line (\d+) \(`([^`]+)`\)", text, flags=re.S)
    assert len(pointers) >= 2
    for path, line, code in pointers:
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            assert f.read().splitlines()[int(line) - 1].strip().startswith(code), (path, line, code)
