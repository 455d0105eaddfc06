"""The Python API as the manual shows it (docs/getting-started.md): its code block runs as written (against a tiny
checkpoint at out/rope), and the names it and the package faces offer import."""

import os
import re
import shutil

import pytest
import torch

from minilm import GPT, ModelConfig
from minilm.checkpoints.format import save
from minilm.checkpoints.loading import load_model
from minilm.config import Config, DataConfig
from minilm.data.tokenizer import Tokenizer
from minilm.figures.canvas import have_matplotlib
from minilm.figures.positions import scheme_figure
from minilm.positions import PositionScheme, describe, register
from minilm.positions.base import _REGISTRY
from tests.conftest import REPO, tiny_text

FIXTURE = os.path.join(REPO, "tests", "fixtures", "main-7334668", "rope.pt")


def manual_python_api() -> str:
    with open(os.path.join(REPO, "docs", "getting-started.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## The Python API", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_the_manual_python_api_runs_as_written(tmp_path, monkeypatch, capsys):
    (tmp_path / "out" / "rope").mkdir(parents=True)
    shutil.copy(FIXTURE, tmp_path / "out" / "rope" / "ckpt.pt")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope = {}
    exec(compile(manual_python_api(), "docs/getting-started.md (Python API)", "exec"), scope)
    assert scope["out"].shape == (1, 1, 4096) and scope["cache"].length == 21
    assert scope["config"].model.position["scaling"]["type"] == "dynamic"
    T, heads = scope["ids"].shape[1], scope["model"].config.n_head
    assert scope["weights"].shape == (1, heads, T, T) and torch.allclose(
        scope["weights"].sum(-1), torch.ones(1, heads, T)
    )
    assert torch.all(scope["weights"].triu(1) == 0)  # causal
    assert capsys.readouterr().out.strip()  # num_params and the generated text


def test_the_faces_name_what_readme_promises():
    from minilm import GPT as Face  # the package face
    from minilm import Config as FaceConfig
    from minilm import load_model as face_load
    from minilm.checkpoints import CheckpointError, Loaded  # noqa: F401
    from minilm.evaluation import evaluate_checkpoints  # noqa: F401
    from minilm.generation import Sampling, generate, generate_ids, generate_text  # noqa: F401
    from minilm.hf import HFError, export_model, read_hf  # noqa: F401
    from minilm.model import GPT as Model  # noqa: F401
    from minilm.training import train  # noqa: F401

    assert Model is Face is GPT and FaceConfig is Config and face_load is load_model


def test_a_scheme_in_one_module_works_everywhere(tmp_path):
    """Adding a scheme that needs no new hook is one module: registered, it builds, trains a
    step, decodes from a cache exactly as the full pass computes, saves and loads, and has a
    label and a figure, with no other file changed. (A learned per-head distance slope: a
    bias scheme with one parameter per head.)"""

    @register("test_slope")
    class LearnedSlope(PositionScheme):
        description = "a learned distance penalty per head (a test scheme)"
        options = {"init": 0.1}
        has_bias = True

        def __init__(self, *, init, **kw):
            super().__init__(**kw)
            self.slope = torch.nn.Parameter(torch.full((self.n_head,), float(init)))

        def bias(self, q_pos, k_pos, q=None):
            return -self.slope[:, None, None] * (q_pos[:, None] - k_pos[None, :]).clamp(min=0)[None]

    try:
        config = ModelConfig(
            vocab_size=97, n_layer=2, n_head=2, d_model=16, block_size=16, position={"kind": "test_slope", "init": 0.2}
        )
        model = GPT(config)
        idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
        model(idx).logsumexp(-1).mean().backward()
        assert model.positions.slope.grad is not None  # it trains
        model.eval()
        with torch.no_grad():
            full = model(idx)
            cache = model.new_cache(2, 16)
            stepped = torch.cat(
                [model(idx[:, :9], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(9, 16)], dim=1
            )
        torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)
        corpus = tmp_path / "text.txt"
        corpus.write_text(tiny_text(300))
        tokenizer = Tokenizer.train(str(corpus), 400)
        config = ModelConfig(**{**config.__dict__, "vocab_size": tokenizer.vocab_size})
        model = GPT(config).eval()
        save(
            {
                "model": model.state_dict(),
                "config": Config(model=config, data=DataConfig(vocab_size=400)).to_dict(),
                "tokenizer": tokenizer.to_bytes(),
            },
            str(tmp_path / "run"),
        )
        loaded = load_model(str(tmp_path / "run")).model
        torch.testing.assert_close(loaded(idx), model(idx))
        assert describe(config.position) == "test_slope init=0.2"
        if have_matplotlib():
            assert scheme_figure(model.positions, config.position) is not None
        else:
            pytest.skip("matplotlib is not installed: the figure was not drawn")
    finally:
        _REGISTRY.pop("test_slope", None)
