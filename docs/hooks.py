"""mkdocs hooks: the reference pages that are generated, so that they cannot fall behind the code,
and the figures minilm's commands drew for the reports, taken from ``reports/`` as they are.

A page holds a marker comment where generated text goes:
- ``<!-- generated: config-keys -->``: every config key from ``minilm.config.config_keys``, the source
  of ``minilm train --help``'s list too;
- ``<!-- generated: cli -->``: the ``--help`` of every command of ``minilm``, as the command prints it;
- ``<!-- output: minilm ARGS -->``: what ``minilm ARGS`` prints on stdout, for commands that compute
  from shapes alone in a second (``minilm memory``), so that a table in the manual is the command's.

The formulas (``$...$`` and ``$$...$$``, which ``pymdownx.arithmatex`` marks) are written as MathML
when the site is built (``latex2mathml``, the docs extra), which every current browser draws
itself: the site needs no script and no network address to show them.
"""

import contextlib
import html
import io
import os
import re
import shlex

from latex2mathml.converter import convert as latex_to_mathml
from mkdocs.structure.files import File

from minilm.__main__ import COMMANDS, USAGE
from minilm.config import config_keys


def config_table() -> str:
    rows = ["| key | default | what it does |", "|---|---|---|"]
    for key, default, choices, text in config_keys():
        valid = f" Valid: {', '.join(f'`{c}`' for c in choices)}." if choices else ""
        cell = text.replace("|", "\\|") + valid
        rows.append(f"| `{key}` | `{default.replace('|', chr(92) + '|')}` | {cell} |")
    return "\n".join(rows)


def command_output(argv: list) -> str:
    """stdout of ``minilm *argv``, run in this process at a fixed terminal width."""
    out, columns = io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                status = COMMANDS[argv[0]](argv[1:])
            except SystemExit as exit:
                status = exit.code
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    if status not in (0, None):
        raise RuntimeError(f"minilm {shlex.join(argv)} failed with status {status}")
    return out.getvalue().rstrip()


def command_help(name: str) -> str:
    return command_output([name, "--help"])


def output_block(match) -> str:
    """A command's stdout as markdown: its first line as a paragraph, then its table and notes."""
    argv = shlex.split(match.group(1))[1:]
    first, *rest = command_output(argv).split("\n")
    blocks = ["*" + first + "*"]
    for line in rest:  # a blank line wherever the table starts or ends
        if blocks[-1].startswith("|") != line.startswith("|"):
            blocks.append("")
        blocks.append(line)
    return "\n".join(blocks)


def cli_pages() -> str:
    parts = ["```text", USAGE, "```"]
    for name in COMMANDS:
        parts += ["", f"## minilm {name}", "", "```text", command_help(name), "```"]
    return "\n".join(parts)


GENERATED = {"<!-- generated: config-keys -->": config_table, "<!-- generated: cli -->": cli_pages}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = {"images/study": os.path.join("reports", "length-generalization")}  # site folder: the report's


def on_files(files, config):
    """The reports' figures join the site under images/, so a page shows the figure the study drew."""
    for site_folder, folder in FIGURES.items():
        for name in sorted(os.listdir(os.path.join(REPO, folder))):
            if name.endswith(".png"):
                path = os.path.join(REPO, folder, name)
                files.append(File.generated(config, f"{site_folder}/{name}", abs_src_path=path))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":  # the report's figure, linked as it is in the repository
        markdown = markdown.replace("](../reports/length-generalization/", "](images/study/")
    for marker, make in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return re.sub(r"^<!-- output: (minilm [^>]*?) -->$", output_block, markdown, flags=re.M)


FORMULA = re.compile(r'<(span|div) class="arithmatex">\\[(\[](.*?)\\[)\]]</\1>', flags=re.S)  # generic mode
TEXT = re.compile(r"\\(text\w*)\{([^{}]*)\}")  # \text{...}, \texttt{...}: a \_ there is an underscore
ROW_SPACE = re.compile(r"\\\\\[[^\]]*\]")  # a row break's extra space, \\[4pt]: the converter would print it


def underscores(match) -> str:
    """``\\texttt{a\\_b}`` as ``\\texttt{a_b}``: in text the converter would keep the backslash."""
    return "\\" + match.group(1) + "{" + match.group(2).replace("\\_", "_") + "}"


def mathml(match) -> str:
    """One formula as arithmatex marked it (``\\(...\\)`` in a span, ``\\[...\\]`` in a div), as MathML."""
    tex = ROW_SPACE.sub(r"\\\\", TEXT.sub(underscores, html.unescape(match.group(2)))).strip()
    try:
        return latex_to_mathml(tex, display="block" if match.group(1) == "div" else "inline")
    except Exception as exc:  # a formula the converter cannot read fails the build, naming it
        raise ValueError(f"formula {tex!r} cannot be written as MathML: {exc}") from None


def on_page_content(content, page, config, files):
    """Every formula of the page as MathML, drawn by the browser without a script or the network."""
    return FORMULA.sub(mathml, content)
