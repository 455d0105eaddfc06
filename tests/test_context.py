"""What the study reads about context use (minilm.study.context): retrieval by distance to the needle with the
seed as the unit, the plan's multi-key setting, and the truncated-context control of the loss by position
(minilm.evaluation.scoring's by_target, minilm.evaluation.lengths.truncated_curve) against a model run on the
windows themselves."""

import pytest
import torch
import torch.nn.functional as F

from minilm.config import ModelConfig
from minilm.evaluation import scoring
from minilm.evaluation.lengths import EvaluationError, _control_request, truncated_curve
from minilm.model.gpt import GPT
from minilm.study import context
from minilm.study.designs import QUICK
from minilm.study.plan import ExperimentError, make_plan
from minilm.study.stats import interval

L = 32
PLAN = {"model": {"block_size": L}, "retrieval": {"multiples": [1, 2, 4, 8]}, "eval": {}}


def row(seed, length, depth, distance, correct, keys=1, label="rope", trials=10):
    return dict(
        section="scratch",
        label=label,
        seed=seed,
        length=length,
        depth=depth,
        distance=distance,
        correct=correct,
        trials=trials,
        keys=keys,
    )


# rows of two seeds: what falls in each bin, per seed
ROWS = [
    row(1, L, 1.0, 2, 10),  # [0, L)
    row(1, 4 * L, 1.0, 2, 8),  # [0, L): a far query, a near needle
    row(1, 2 * L, 0.0, 2 * L - 3, 6),  # [L, 2L)
    row(1, 4 * L, 0.5, 2 * L + 1, 1),  # [2L, 4L)
    row(1, 4 * L, 0.0, 4 * L - 3, 3),  # [2L, 4L)
    row(2, L, 1.0, 2, 9),
    row(2, 4 * L, 1.0, 2, 9),
    row(2, 2 * L, 0.0, 2 * L - 3, 2),
    row(2, 4 * L, 0.5, 2 * L + 1, 0),
    row(2, 4 * L, 0.0, 4 * L - 3, 1),
    row(1, 4 * L, 1.0, 2, 0, keys=4),  # multi-key rows: a table of their own
    row(2, 4 * L, 1.0, 2, 10, keys=4),
    row(1, 8 * L, 0.0, 8 * L - 3, None, label="learned"),  # past a bounded scheme's table
    row(1, L, 0.0, L - 3, 5, label="learned"),
]


def test_retrieval_by_distance_bins_in_units_of_L_with_the_seed_as_the_unit():
    bins = context.distance_bins(PLAN)
    assert bins == [(0, L, "[0, L)"), (L, 2 * L, "[L, 2L)"), (2 * L, 4 * L, "[2L, 4L)"), (4 * L, 8 * L, "[4L, 8L)")]
    got = [context.distance_accuracies(ROWS, "scratch", "rope", a, b) for a, b, _ in bins]
    # each seed's probes of a bin counted together (lengths and depths alike): (10 + 8) / 20, (9 + 9) / 20, ...
    assert got == [{1: 0.9, 2: 0.9}, {1: 0.6, 2: 0.2}, {1: 0.2, 2: 0.05}, None]
    assert context.distance_accuracies(ROWS, "scratch", "rope", 0, L, keys=4) == {1: 0.0, 2: 1.0}
    text = context.distance_table(
        ROWS, [("rope", "scratch", "rope", None), ("learned", "scratch", "learned", None)], bins
    )
    lines = text.splitlines()
    assert lines[0] == "| model | [0, L) | [L, 2L) | [2L, 4L) | [4L, 8L) |"
    spread = interval([0.6, 0.2]).half_width  # the t-interval over the two seeds' accuracies
    assert lines[2] == f"| rope | 90% ± 0 (90/90) | 40% ± {100 * spread:.0f} (60/20) | 12% ± 95 (20/5) |  |"
    assert lines[3] == "| learned | 50% (50) |  |  | n/a (bounded) |"  # one seed: no interval


def test_the_plan_asks_for_multikey_probes_that_fit_and_a_valid_stride():
    assert context.multikey(make_plan(quick=True)) == QUICK["retrieval"]["keys"] > 1
    assert context.multikey(make_plan()) == 4 and context.multikey(make_plan("ablation")) == 0
    with pytest.raises(
        ExperimentError, match=r"retrieval.keys=3 is invalid: expected an integer from 1 .* to 2 at L=32"
    ):
        make_plan(quick=True, overrides=["retrieval.keys=3"])
    with pytest.raises(ExperimentError, match=r"eval.truncated_stride=0 is invalid: expected an integer from 1 to 32"):
        make_plan(quick=True, overrides=["eval.truncated_stride=0"])
    assert _control_request(8, None) == (8, "sliding", 4) and _control_request(None, 3) is None
    with pytest.raises(EvaluationError, match="truncated_stride=9 is invalid: expected an integer from 1 to 8"):
        _control_request(8, 9)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=50, n_layer=2, n_head=2, d_model=16, block_size=8, position={"kind": "rope"}))


@torch.no_grad()
def last_loss(model, window: torch.Tensor, target: int) -> float:
    """The loss of ``target`` after ``window``, the model run on the window alone."""
    return float(F.cross_entropy(model(window[None])[0, -1:], torch.tensor([target])))


@torch.no_grad()
def test_the_truncated_control_scores_each_position_past_L_on_its_last_L_tokens(model):
    """Stride 1: position p >= cut of every segment is scored on tokens[p - cut + 1 : p + 1] alone; below
    ``cut`` the curve is the whole segment's (no context to cut)."""
    tokens, length, cut = torch.randint(0, 50, (65,), generator=torch.Generator().manual_seed(1)), 32, 8
    curves, targets = [], []
    requests = [(length, "nonoverlapping", None), (cut, "sliding", 1)]
    scoring.score_many(model, tokens, requests, by_position=curves, by_target=targets)
    assert targets[0].isfinite().all() and targets[1].isfinite().all()  # every target scored by every request
    got = truncated_curve(curves[0], targets[1], length, cut)
    expected = curves[0].clone()
    for p in range(cut, length):
        losses = [last_loss(model, tokens[b + p - cut + 1 : b + p + 1], int(tokens[b + p + 1])) for b in (0, 32)]
        expected[p] = sum(losses) / 2
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got[cut:], curves[0][cut:], atol=1e-4)  # the cut context changes the losses


@torch.no_grad()
def test_the_default_control_shares_the_sliding_protocols_windows(model):
    """Stride cut / 2 (the sliding protocol's): each target is scored on its window from the segment's start,
    with between cut / 2 and cut - 1 tokens before it, as a direct run of the model on that window gives."""
    tokens, cut = torch.randint(0, 50, (41,), generator=torch.Generator().manual_seed(2)), 8
    targets = []
    scoring.score_many(model, tokens, [(cut, "sliding", None)], by_target=targets)
    for begin, end, scored in scoring.segments(40, cut, "sliding"):
        for i in range(end - scored, end):
            assert begin == 0 or cut // 2 <= i - begin <= cut - 1
            assert float(targets[0][i]) == pytest.approx(
                last_loss(model, tokens[begin : i + 1], int(tokens[i + 1])), rel=1e-5, abs=1e-6
            )
