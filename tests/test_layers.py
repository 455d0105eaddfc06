"""The shape of the package, as docs/design.md describes it: every unit (a top-level module or
a subpackage) has a layer and imports only run down the layers, so no two units import each
other; inside a subpackage, modules import only those listed before them in the table; the
package root holds few modules; command-line code lives in minilm/cli/ only; imports of
minilm modules sit at the top of each file; and modules and functions stay small."""

import ast
import importlib
import io
import os
import re
import subprocess
import sys
import tokenize

import pytest

from tests.conftest import REPO

PACKAGE = os.path.join(REPO, "minilm")
DESIGN = os.path.join(REPO, "docs", "design.md")
# sizes in statement lines (``statement_lines``): a call the formatter spreads over several lines counts once
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 75
MAX_ROOT_MODULES = 6  # besides the subpackages: __init__, __main__, common, config, ...
FREE_ORDER = ("positions", "cli")  # the registry's schemes and the commands import each other freely


def layer_table() -> tuple:
    """({unit: layer}, {unit: [module, ...]}) from the '## Layers' table of docs/design.md."""
    with open(DESIGN, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers, orders = {}, {}
    for number, name, members in re.findall(r"^\| (\d+) \| (.+?) \| (.*?) ?\|$", section, flags=re.M):
        name = name.strip().replace("\\_", "_")
        layers[name] = int(number)
        orders[name] = [m.strip().replace("\\_", "_") for m in members.split(",") if m.strip()]
    return layers, orders


def modules() -> dict:
    """{dotted name: path} of every module in the minilm package."""
    found = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                found[rel.removesuffix(".__init__")] = path
    return found


def unit(module: str) -> str:
    """The layer-table entry a module belongs to: minilm.model.gpt -> model."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def is_package(module: str) -> bool:
    return MODULES[module].endswith("__init__.py")


def minilm_imports(tree: ast.AST, module: str, known: dict):
    """(line, imported module, at top level?) for every import of a minilm module."""
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minilm"):
            # 'from minilm import data' imports the submodule minilm.data
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            ]
        for name in names:
            if name == "minilm" or name.startswith("minilm."):
                yield node.lineno, name, id(node) in top


LAYERS, ORDERS = layer_table()
MODULES = modules()


def imports_of(module: str) -> list:
    with open(MODULES[module], encoding="utf-8") as f:
        return list(minilm_imports(ast.parse(f.read()), module, MODULES))


def test_the_table_places_every_unit():
    units = {unit(m) for m in MODULES} - {"__init__"}
    missing = sorted(units - set(LAYERS))
    assert not missing, f"units missing from the layer table of docs/design.md: {missing}"
    stale = sorted(set(LAYERS) - units)
    assert not stale, f"docs/design.md lists units that do not exist: {stale}"
    assert len(set(LAYERS.values())) == len(LAYERS), "each unit has a layer of its own"


def test_the_table_lists_each_subpackage_module():
    for name, listed in ORDERS.items():
        if name in FREE_ORDER or not listed:
            continue
        present = {m.split(".")[2] for m in MODULES if unit(m) == name and m.count(".") == 2}
        assert set(listed) == present, f"docs/design.md lists {name}/ as {listed}; it holds {sorted(present)}"


def test_the_root_holds_few_modules():
    root = sorted(m for m in MODULES if m.count(".") <= 1 and not is_package(m) or m == "minilm")
    assert len(root) <= MAX_ROOT_MODULES, f"minilm/ holds {len(root)} modules besides its subpackages: {root}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if unit(m) != "__init__"))
def test_imports_only_run_down_the_layers(module):
    mine = LAYERS[unit(module)]
    for line, name, _ in imports_of(module):
        assert name != "minilm", f"{module}:{line} imports the package face; import from the defining module"
        theirs = LAYERS[unit(name)]
        assert theirs <= mine, (
            f"{module}:{line} (layer {mine}) imports {name} from the higher layer {theirs}; see docs/design.md"
        )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.count(".") == 2 and unit(m) not in FREE_ORDER))
def test_modules_of_a_subpackage_import_only_those_before_them(module):
    order = ORDERS[unit(module)]
    mine = order.index(module.split(".")[2])
    package = f"minilm.{unit(module)}"
    for line, name, _ in imports_of(module):
        assert name != package, f"{module}:{line} imports its own package's face; import from the defining module"
        if name.startswith(package + "."):
            theirs = order.index(name.split(".")[2])
            assert theirs < mine, (
                f"{module}:{line} imports {name}, listed after it in docs/design.md ({', '.join(order)})"
            )


FACES_TO_IMPORT_FROM = ("minilm.positions", "minilm.cli")  # the registry; the commands' own helpers


def face_imports(tree: ast.AST) -> list:
    """'line: from PACKAGE import NAME' for each name imported from a subpackage's face."""
    return [
        f"{node.lineno}: from {node.module} import {a.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module in MODULES
        and is_package(node.module)
        and node.module != "minilm"
        and node.module not in FACES_TO_IMPORT_FROM
        for a in node.names
        if f"{node.module}.{a.name}" not in MODULES
    ]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_code_imports_names_from_their_defining_module_not_a_face(module):
    """``from minilm.model import GPT`` is for users; inside the package it is minilm.model.gpt."""
    with open(MODULES[module], encoding="utf-8") as f:
        faces = face_imports(ast.parse(f.read()))
    assert not faces, f"{module}: import from the defining module instead: {faces}"


def test_the_checker_sees_an_import_from_a_face():
    assert face_imports(ast.parse("from minilm.model import GPT\n")) == ["1: from minilm.model import GPT"]
    assert face_imports(ast.parse("from minilm.model.gpt import GPT\nfrom minilm.model import cache\n")) == []


def test_no_import_cycles_between_units():
    graph = {}
    for module in MODULES:
        for _, name, _ in imports_of(module):
            if unit(name) != unit(module):
                graph.setdefault(unit(module), set()).add(unit(name))
    seen, stack = set(), []

    def visit(node):
        assert node not in stack, f"import cycle: {' -> '.join(stack[stack.index(node) :] + [node])}"
        if node in seen:
            return
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        stack.pop()
        seen.add(node)

    for node in sorted(graph):
        visit(node)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_minilm_imports_sit_at_the_top(module):
    inside = [f"{module}:{line} {name}" for line, name, top in imports_of(module) if not top]
    assert not inside, f"imports inside functions: {inside}"


def test_command_line_code_lives_in_the_cli_home():
    offenders = []
    for module, path in MODULES.items():
        if unit(module) in ("cli", "__main__"):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if "argparse" in names:
                    offenders.append(f"{module}:{node.lineno} imports argparse")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
                and node.attr in ("argv", "stdin")
            ):
                offenders.append(f"{module}:{node.lineno} uses sys.{node.attr}")
    assert not offenders, offenders


def statement_lines(source: str) -> set:
    """The line numbers a reader counts: each line that starts a statement or continues one outside
    brackets, each line of a comment or a docstring; not blank lines, and not the lines that continue a
    bracketed expression, so the count does not change when ``ruff format`` spreads a call over lines."""
    counted, depth = set(), 0
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and depth == 0):
            counted.update(range(token.start[0], token.end[0] + 1))
        elif token.type not in skip and depth == 0:
            counted.add(token.start[0])
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
    return counted


def test_modules_and_functions_stay_small():
    big = []
    for module, path in MODULES.items():
        with open(path, encoding="utf-8") as f:
            source = f.read()
        counted = statement_lines(source)
        if len(counted) > MAX_MODULE_LINES:
            big.append(f"{module}: {len(counted)} statement lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = sum(node.lineno <= line <= node.end_lineno for line in counted)
                if length > MAX_FUNCTION_LINES:
                    big.append(f"{module}.{node.name}: {length} statement lines")
    assert not big, big


def test_statement_lines_do_not_change_with_the_layout():
    """One statement is the same size on one line or spread over five; comments and docstrings count."""
    one = 'def f(a, b):\n    """Doc."""\n    # note\n    return g(a, b, c=[1, 2])\n'
    spread = (
        'def f(a, b):\n    """Doc."""\n    # note\n    return g(\n        a,\n        b,\n        c=[1, 2],\n    )\n'
    )
    assert len(statement_lines(one)) == len(statement_lines(spread)) == 4
    assert len(statement_lines('x = 1\n\n\ny = """a\nb\nc"""\n')) == 4


def test_the_checker_sees_an_upward_import(tmp_path):
    """The layer check itself can fail: a model module importing the trainer is caught."""
    tree = ast.parse("from minilm.training.loop import train\n")
    (name,) = [n for _, n, _ in minilm_imports(tree, "minilm.model", MODULES)]
    assert LAYERS[unit(name)] > LAYERS[unit("minilm.model")]


@pytest.mark.slow
def test_the_commands_start_without_fsdp_and_dcp():
    """torch's FSDP2 and distributed checkpoint cost about a second to import: every command
    module loads without them, and a run imports them only when it shards (docs/design.md)."""
    commands = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "minilm", "cli")) if f.endswith(".py"))
    code = (
        "import sys\n"
        + "".join(f"import minilm.cli.{c}\n" for c in commands)
        + "print(sorted(m for m in sys.modules if m.startswith(('torch.distributed.checkpoint', "
        "'torch.distributed.fsdp', 'torch.distributed.tensor'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


NAMED_MODULE = re.compile(r"\bminilm(?:/[A-Za-z0-9_]+)+\.py\b|\bminilm(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def named_module_exists(name: str) -> bool:
    """Whether ``minilm/x/y.py`` is a file, or ``minilm.x.y[.name]`` names a module (and the lower-case
    name after its longest module part, if any, something the module has; constants are not checked)."""
    if "/" in name:
        return os.path.isfile(os.path.join(REPO, name))
    parts = name.split(".")
    longest = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in MODULES)
    rest = parts[longest:]
    return not rest or not rest[0].islower() or hasattr(importlib.import_module(".".join(parts[:longest])), rest[0])


def test_the_modules_that_help_texts_docstrings_and_configs_name_exist():
    """Modules move (``minilm/plots.py`` is minilm/figures/ now): no help text, docstring, comment or
    shipped config names one that is gone."""
    configs = os.path.join(PACKAGE, "configs")
    paths = list(MODULES.values()) + [os.path.join(configs, f) for f in os.listdir(configs) if f.endswith(".yaml")]
    missing = []
    for path in sorted(paths):
        with open(path, encoding="utf-8") as f:
            named = set(NAMED_MODULE.findall(f.read()))
        missing += [f"{os.path.relpath(path, REPO)}: {n}" for n in sorted(named) if not named_module_exists(n)]
    assert not missing, f"names of modules that do not exist: {missing}"


def test_every_public_class_says_what_it_is():
    """Every class a module defines at its top level without a leading underscore has a docstring."""
    bare = []
    for folder, _, files in os.walk(os.path.join(REPO, "minilm")):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not ast.get_docstring(node):
                    bare.append(f"{os.path.relpath(path, REPO)}: {node.name}")
    assert not bare


def test_the_design_notes_list_every_user_facing_error():
    """docs/design.md's "Errors:" paragraph names every class that subclasses common.MinilmError (what
    run_command turns into one line with status 2), and no other."""
    bases = {}
    for path in MODULES.values():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
    user_facing, grown = {"MinilmError"}, True
    while grown:
        more = {name for name, of in bases.items() if set(of) & user_facing} - user_facing
        user_facing |= more
        grown = bool(more)
    with open(DESIGN, encoding="utf-8") as f:
        paragraph = f.read().split("\nErrors: ", 1)[1].split("A command catches", 1)[0]
    listed = set(re.findall(r"`([A-Z]\w+)`", paragraph))
    bound = "YAMLBoundError"  # yaml's own kind of error, named there as not one of them
    assert bound in listed and bound not in user_facing
    assert listed - {bound, "MinilmError"} == user_facing - {"MinilmError"}
