"""``minilm positions layers``: a config's layer design (``model.layers``) as a table, one row per layer,
and its figure, whose grids are the attention's own mask (``minilm.model.attention.visible``); the
command end to end in a process of its own, and bad input as one ``error:`` line with exit status 2."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from minilm.cli import positions
from minilm.model.attention import visible
from minilm.positions.layers import layer_types
from tests.conftest import REPO
from tests.forkrun import run_python

PNG = b"\x89PNG\r\n\x1a\n"


def table_rows(out: str) -> list:
    """The body rows of the first markdown table in ``out``, as lists of cells."""
    lines = [line for line in out.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_the_table_has_a_row_per_layer_of_rnope_swa(capsys):
    assert positions.main(["layers", "rnope_swa.yaml"]) == 0
    out = capsys.readouterr().out
    header = [cell.strip() for cell in out.splitlines()[1].strip("|").split("|")]
    assert header == ["layer", "type", "position", "window", "chunk", "learned sinks", "softcap", "query scale"]
    rows = table_rows(out)
    assert [row[:2] for row in rows] == [["0", "local"], ["1", "local"], ["2", "local"], ["3", "global"]]
    for row in rows[:3]:  # three sliding RoPE layers of 64 keys, nothing else set
        assert row[2:] == ["rope", "64", "\u2014", "\u2014", "\u2014", "\u2014"]
    assert rows[3][2:] == ["none", "\u2014", "\u2014", "\u2014", "\u2014", "\u2014"]  # global NoPE
    assert "pattern [local, local, local, global]" in out.splitlines()[0]


def test_a_model_without_layers_is_one_row_of_model_position(capsys):
    assert positions.main(["layers", "rope.yaml", "model.n_layer=3", "model.position.base=500000"]) == 0
    out = capsys.readouterr().out
    assert "model.layers unset" in out.splitlines()[0]
    (row,) = table_rows(out)
    assert row[0] == "0-2" and row[2] == "rope base=500000" and row[3:] == ["\u2014"] * 5
    assert positions.main(["layers", "model.layers={pattern: [all], all: {window: 2}}"]) == 0  # a type named all
    assert [row[:4] for row in table_rows(capsys.readouterr().out)] == [[str(i), "all", "rope", "2"] for i in range(4)]


def test_every_setting_of_a_layer_type_has_its_column(capsys):
    design = (
        "model.layers={pattern: [a, b], a: {window: 8, sinks: learned, softcap: 30, "
        "query_scale: {beta: 0.1, floor: 8192, offset: 1}}, b: {chunk: 16, position: {kind: none}}}"
    )
    assert positions.main(["layers", design]) == 0  # no config file: the overrides apply to rope.yaml
    rows = table_rows(capsys.readouterr().out)
    assert rows[0] == ["0", "a", "rope", "8", "\u2014", "yes", "30", "beta=0.1 floor=8192 offset=1"]
    assert rows[1] == ["1", "b", "none", "\u2014", "16", "\u2014", "\u2014", "\u2014"]
    assert len(rows) == 4 and rows[2][1:] == rows[0][1:] and rows[3][1:] == rows[1][1:]  # the pattern repeats


def test_the_figure_draws_what_visible_computes(tmp_path):
    pytest.importorskip("matplotlib")
    from minilm.figures.layers import plot_layers

    layers = {"pattern": ["w", "c", "g"], "w": {"window": 4}, "c": {"chunk": 3}, "g": {}}
    types = layer_types(layers, {"kind": "rope"}, 6)
    drawn = plot_layers(types, str(tmp_path / "layers.png"), length=10)
    assert drawn.path == str(tmp_path / "layers.png") and open(drawn.path, "rb").read(8) == PNG
    assert list(drawn.grids) == ["w", "c", "g"]  # one panel per distinct type, in order of appearance
    pos = torch.arange(10, dtype=torch.float32)
    for layer_type in types[:3]:
        assert torch.equal(drawn.grids[layer_type.name], visible(pos, pos, layer=layer_type))
    p, j = torch.arange(10)[:, None], torch.arange(10)[None, :]
    assert torch.equal(drawn.grids["w"], (j <= p) & (j > p - 4))  # p - W < j <= p: four keys, itself included
    assert torch.equal(drawn.grids["c"], (j <= p) & (j // 3 == p // 3))  # its own chunk only
    assert torch.equal(drawn.grids["g"], j <= p)  # causal, nothing hidden


def run_cli(*args, cwd=REPO):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO, "MPLBACKEND": "Agg"}
    return run_python(["-m", "minilm", "positions", "layers", *args], cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The command end to end and two bad inputs, each in its own process, at once."""
    scratch = tmp_path_factory.mktemp("layers")
    cases = {
        "figure": ("rnope_swa.yaml", "--out", str(scratch / "rnope.png")),
        "length": ("rnope_swa.yaml", "--length", "1", "--out", str(scratch / "short.png")),
        "design": ("rnope_swa.yaml", "model.layers.pattern=[local, glbal]"),
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        done = dict(zip(cases, pool.map(lambda args: run_cli(*args), cases.values())))
    return scratch, done


@pytest.mark.slow
def test_the_command_writes_the_figure(runs):
    pytest.importorskip("matplotlib")
    scratch, done = runs
    result = done["figure"]
    assert result.returncode == 0, result.stderr
    assert open(scratch / "rnope.png", "rb").read(8) == PNG
    assert len(table_rows(result.stdout)) == 4
    assert f"wrote {scratch / 'rnope.png'}: the keys each query sees over 192 positions" in result.stdout  # 3 x 64


@pytest.mark.slow
@pytest.mark.parametrize("case, named", [("length", "--length='1'"), ("design", "'glbal'")])
def test_bad_input_is_one_error_line(runs, case, named):
    scratch, done = runs
    result = done[case]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and named in lines[0]
    assert result.stdout == "" and not (scratch / "short.png").exists()
