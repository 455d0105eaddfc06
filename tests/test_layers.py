"""The shape of the package, as docs/design.md describes it: imports only run down the layer
table, every module is placed in it, command-line code lives in minilm/cli/ only, imports of
minilm modules sit at the top of each file, and modules and functions stay small."""
import ast
import os
import re

import pytest

from tests.conftest import REPO

PACKAGE = os.path.join(REPO, "minilm")
DESIGN = os.path.join(REPO, "docs", "design.md")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def layer_table() -> dict:
    """{unit: layer} from the '## Layers' table of docs/design.md (unit: a module or a package)."""
    with open(DESIGN, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for number, names in re.findall(r"^\| (\d+) \| (.+?) \|$", section, flags=re.M):
        for name in names.split(","):
            layers[name.strip().replace("\\_", "_")] = int(number)
    return layers


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
    """The layer-table entry a module belongs to: minilm.positions.rope -> positions."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def minilm_imports(tree: ast.AST, module: str, known: dict):
    """(line, imported module, at top level?) for every import of a minilm module."""
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minilm"):
            # 'from minilm import data' imports the submodule minilm.data
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        for name in names:
            if name == "minilm" or name.startswith("minilm."):
                yield node.lineno, name, id(node) in top


LAYERS = layer_table()
MODULES = modules()


def test_the_table_places_every_module():
    units = {unit(m) for m in MODULES} - {"__init__"}
    missing = sorted(units - set(LAYERS))
    assert not missing, f"modules missing from the layer table of docs/design.md: {missing}"
    stale = sorted(set(LAYERS) - units)
    assert not stale, f"docs/design.md lists modules that do not exist: {stale}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if unit(m) != "__init__"))
def test_imports_only_run_down_the_layers(module):
    with open(MODULES[module], encoding="utf-8") as f:
        tree = ast.parse(f.read())
    mine = LAYERS[unit(module)]
    for line, name, _ in minilm_imports(tree, module, MODULES):
        assert name != "minilm", f"{module}:{line} imports the package face; import from the defining module"
        theirs = LAYERS[unit(name)]
        assert theirs <= mine, (f"{module}:{line} (layer {mine}) imports {name} from the higher layer {theirs}; "
                                f"see docs/design.md")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_minilm_imports_sit_at_the_top(module):
    with open(MODULES[module], encoding="utf-8") as f:
        tree = ast.parse(f.read())
    inside = [f"{module}:{line} {name}" for line, name, top in minilm_imports(tree, module, MODULES) if not top]
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
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys" \
                    and node.attr in ("argv", "stdin"):
                offenders.append(f"{module}:{node.lineno} uses sys.{node.attr}")
    assert not offenders, offenders


def test_modules_and_functions_stay_small():
    big = []
    for module, path in MODULES.items():
        with open(path, encoding="utf-8") as f:
            source = f.read()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            big.append(f"{module}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    big.append(f"{module}.{node.name}: {length} lines")
    assert not big, big


def test_the_checker_sees_an_upward_import(tmp_path):
    """The layer check itself can fail: a model module importing the trainer is caught."""
    tree = ast.parse("from minilm.trainer import train\n")
    (name,) = [n for _, n, _ in minilm_imports(tree, "minilm.model", MODULES)]
    assert LAYERS[unit(name)] > LAYERS[unit("minilm.model")]
