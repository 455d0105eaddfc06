"""The experiments' designs: each experiment's plan as nested settings (``PLANS``: the full run and
its ``--quick`` smoke test), the kinds and arms a plan trains from scratch, and how the retrieval task
enters a training row at any length. ``minilm.study.plan`` applies overrides (``make_plan``) and builds
the runs.

- **length-generalization** (``FULL``): every kind of ``KINDS`` and the 2025 hybrids (``arms``) at L = 128,
  extended to 4L, with the controls; its claims: ``registered/length-generalization.yaml``.
- **replication-512** (``REPLICATION``): the frozen design at L = 512 on fresh seeds, from scratch on three times
  the first's tokens (issue #58).
- **ablation** (``ABLATION_FULL``): variants of the study's models against references (``minilm.study.ablation``).
"""

from __future__ import annotations

import copy

from minilm.data.retrieval import QUERIES
from minilm.study.ablation import GROUPS
from minilm.study.extension import METHOD_NAMES, OTHER_EXTENSIONS
from minilm.training.mixture import weight_for_share

KINDS = ("sinusoidal", "learned", "rope", "alibi", "t5", "none", "kerple", "fire", "xpos", "shaw", "randomized")


def scratch_labels(plan: dict) -> list:
    """The rows trained from scratch: the plan's ``kinds`` (default ``KINDS``), then its ``arms`` (per-layer
    designs)."""
    return [*plan.get("kinds", KINDS), *plan.get("arms", {})]


EXPERIMENTS = ("length-generalization", "replication-512", "ablation")

# The full study (measurements: docs/design.md, "Measured choices"). dtype auto: bf16 autocast where the
# CPU has native bf16 (1.4x float32's tokens/s at this shape, torch 2.13; the ablation's dtype group is the
# paired float32 check). Every training sequence (pretraining and fine-tuning alike) is text with one
# needle written over it (``minilm.data.retrieval``, asked three times) and keeps its text's loss: every
# text token counts once, each answer 8 times (``train.retrieval_weight``), so the task cannot buy its
# accuracy with the model's text. Untied embeddings: tied, the task's ids collapse onto one direction.
FULL = {
    "experiment": "length-generalization",
    "seeds": [1, 2, 3, 4, 5],
    # seeds 6-8 train again only the rows the retrieval claims read (``Study._build_claim_seeds``): the exact
    # sign-flip test's p cannot fall below 2^-n, 1/32 at five seeds, which no claim survives Holm's correction with
    "claim_seeds": [6, 7, 8],
    # one embedding recipe for every scheme: GPT-2's (the token table N(0, 0.02), each scheme's own input
    # multiplier: sqrt(d) for sinusoidal, as Vaswani et al.). fairseq's for every scheme (N(0, d^-1/2) x sqrt(d))
    # cost rope the task (17% at L against 100%) and text (2.3945 against 2.3588 bits/char text-only): design.md
    "model": {
        "n_layer": 3,
        "n_head": 4,
        "d_model": 128,
        "block_size": 128,
        "dropout": 0.0,
        "bias": False,
        "tie_embeddings": False,
    },
    # the train split's last 32,768 tokens are held out of every run: the sweep chooses the fine-tuning rate there
    "data": {"corpus": "shakespeare", "vocab_size": 1024, "dir": "data", "holdout_tokens": 32768},
    "train": {
        "batch_size": 16,
        "max_steps": 500,
        "lr": 2.0e-3,
        "min_lr": 2.0e-4,
        "warmup_steps": 50,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "dtype": "auto",
        "device": "cpu",
        "retrieval_share": 1.0,
    },
    "finetune": {"batch_size": 1, "lr": 5.0e-4, "min_lr": 5.0e-5, "warmup_steps": 10},
    # minilm.study.tuning: each kind's rate, x these scales of train.lr, chosen on held-out text at the tuning seeds
    # (the tuning step, run once before the study: ``--tune``; the rates frozen in registered/<experiment>.rates.yaml)
    # (the grids start where the first confirmatory run's choices lay: x0.5 and 3e-5 were never chosen; a choice at an
    # edge extends its grid, x0.5 and 3e-5 included)
    "tuning": {"seeds": [101, 102], "lr_scales": [1.0, 2.0, 4.0], "task_floor": 0.5},
    # minilm.study.sweep: each extension row's rate, chosen on held-out text at the tuning seeds
    "sweep": {"lrs": [1.0e-4, 3.0e-4, 1.0e-3]},
    "extension": {
        "factor": 4,
        "methods": list(METHOD_NAMES),
        "curve_steps": [0, 25, 50, 100, 200, 400],
        "curve_multiples": [1, 2, 4, 8],
        # minilm.study.papers: every row again fine-tuned on text alone (its twin's rate), and the PI paper's
        # passkey at factor x L before (the method zero-shot) and after fine-tuning, this many keys per depth
        "text_only": True,
        "passkey_trials": 8,
    },
    "eval": {
        "multiples": [1, 2, 4, 8],
        "modes": ["nonoverlapping", "sliding", "fixed-stride"],
        "fixed_stride": None,
        "max_tokens": 32768,
        "batch_tokens": 8192,
        "position_bin": 8,
        # the loss by position's control with the context cut to L: windows of L advancing by this (None: L / 2,
        # the sliding protocol's, whose runs it shares; 1: exactly the last L tokens, L / 2 times the cost)
        "truncated_stride": None,
    },
    # query_density [q, T]: a training row of T tokens asks its needle q times, a row of n tokens round(q n / T)
    # times (``queries_for``: the answers as dense at 4L as at L; with 3 a row at 512 the oracle learned nothing);
    # answer_share: the answers' share of a row's loss weight at every length (``run_config`` sets each run's
    # train.retrieval_weight from both: ``minilm.training.mixture.weight_for_share``); 6 / 35 is each answer
    # counted 8 times at L = 128 (24 / (116 + 24)), the weight the first confirmatory run used at every length;
    # spread (train.retrieval_spread): the first query of a row at a distance drawn uniformly over it, the other
    # queries after it. Without it each answer can be copied from the query before it and the lookups stay short
    # at every length, which is why the oracle missed far needles (docs/guides/study.md, the pilots); every run
    # trains on rows placed this way, so extension and oracle learn the same task (the rates file must be tuned for it)
    "retrieval": {
        "multiples": [1, 2, 4, 8],
        "depths": [0.0, 0.25, 0.5, 0.75, 1.0],
        "trials": 32,
        "answer_share": 6 / 35,
        "query_density": [3, 128],
        "spread": True,
        "keys": 4,  # multi-key probes beside the single needle: 4 pairs, the one at the depth asked (``context``)
    },
    # per kind, its reference code's settings where minilm's defaults differ (docs/design.md, "Baselines as
    # their reference code"): KERPLE's floor 1e-2; xPos's scale_base L / 2 (torchscale: 512 for 1,024);
    # randomized positions sampled at evaluation too (``randomized_reach``). T5 keeps its layout (32 buckets
    # to 128) and its table learns at 30x: at the schedule's rate it cannot reach ALiBi's scale in 500 steps.
    "schemes": {
        "t5": {"train": {"position_lr_scale": 30.0}},
        "kerple": {"position": {"floor": 1.0e-2}},
        "xpos": {"position": {"scale_base": 64.0}},
        "randomized": {"position": {"eval_positions": "sampled"}},
    },
    # the 2025 hybrids (issue #58): positions chosen per layer (``model.layers``, docs/concepts/layers.md), each an
    # arm from scratch beside the kinds, at a rate the tuning step chooses for it; with 3 layers, "every 4th" is
    # the last of three. label -> its position setting and model settings.
    "arms": {
        # Yang et al. 2025 (RNoPE-SWA): RoPE over a sliding window of L / 4 keys, then a global layer without positions
        "rnope-swa": {
            "position": {"kind": "rope"},
            "model": {
                "layers": {
                    "pattern": ["local", "local", "global"],
                    "local": {"window": 32},
                    "global": {"position": {"kind": "none"}},
                }
            },
        },
        # SmolLM3 (Hugging Face 2025): NoPE on every 4th layer, RoPE on the rest, no window
        "nope-last": {
            "position": {"kind": "rope"},
            "model": {
                "layers": {"pattern": ["rope", "rope", "nope"], "rope": {}, "nope": {"position": {"kind": "none"}}}
            },
        },
        # Barbero et al. 2025 (p-RoPE): the lowest quarter of the frequencies removed (p = 0.75)
        "p-rope": {"position": {"kind": "rope", "scaling": {"type": "proportional", "fraction": 0.75}}, "model": {}},
        # GPT-OSS (OpenAI 2025): a learned sink logit per head in every layer's softmax, RoPE
        "sinks": {
            "position": {"kind": "rope"},
            "model": {"layers": {"pattern": ["all"], "all": {"sinks": "learned"}}},
        },
        # SSMax (Nakanishi 2025) as Llama 4 writes it: NoPE with queries scaled by 1 + 0.1 ln(1 + p + 1) at position p
        "nope-qscale": {
            "position": {"kind": "none"},
            "model": {"layers": {"pattern": ["all"], "all": {"query_scale": {"beta": 0.1, "floor": 1, "offset": 1}}}},
        },
    },
    # oracle: these kinds trained from scratch at factor x L, oracle_batch_scale x the pretraining's rows per step (1:
    # its sequences, factor x its tokens) for oracle_steps_scale x its steps (unset: 1; the replication's 2/3, its quick
    # plan's 2), at the first oracle_seeds seeds, and (oracle_equal_tokens) on the pretraining's tokens
    # (``extension.oracle_runs``); keep_training: rope trained on at L with the fine-tuning's tokens
    "controls": {
        "oracle": ["rope"],
        "oracle_seeds": 3,
        "oracle_batch_scale": 1.0,
        "oracle_equal_tokens": True,
        "keep_training": True,
        "other_extensions": list(OTHER_EXTENSIONS),
    },
}


def queries_for(plan: dict, length: int) -> int:
    """Queries of the needle in a training row of ``length`` tokens: ``retrieval.query_density`` [q, T]
    in proportion, at least one (without it, ``minilm.data.retrieval.QUERIES``)."""
    count, per = plan.get("retrieval", {}).get("query_density") or (QUERIES, length)
    return max(1, round(count * length / per))


# --quick: the same graph with tiny models and budgets (a smoke test of a few minutes).
QUICK = copy.deepcopy(FULL)
QUICK["seeds"] = [1, 2]
QUICK["claim_seeds"] = [9]
QUICK["model"].update({"n_layer": 1, "n_head": 2, "d_model": 32, "block_size": 32})
QUICK["train"].update({"batch_size": 8, "max_steps": 30, "warmup_steps": 5, "lr": 3.0e-3, "min_lr": 3.0e-4})
QUICK["finetune"].update({"warmup_steps": 2})
QUICK["extension"].update(
    {"methods": ["none", "linear", "dynamic", "yarn"], "curve_steps": [0, 5, 10], "passkey_trials": 2}
)
# one scale and one rate: the smoke test runs the tuning step's chain once; its rounds are the tests'
QUICK["sweep"]["lrs"] = [1.0e-3]
QUICK["tuning"].update(
    {"seeds": [101], "lr_scales": [1.0], "task_floor": 0.0}
)  # 30 steps learn no retrieval: nothing is rejected
QUICK["controls"]["oracle_seeds"] = 1
QUICK["eval"].update({"max_tokens": 2048, "position_bin": 4})
QUICK["data"]["holdout_tokens"] = 2048
QUICK["retrieval"].update({"depths": [0.0, 0.5, 1.0], "trials": 4, "keys": 2})  # 2 pairs fit at L = 32
QUICK["schemes"]["xpos"]["position"]["scale_base"] = 16.0  # L / 2 again (L = 32)
QUICK["arms"]["rnope-swa"]["model"]["layers"]["local"]["window"] = 8  # L / 4 again
for _arm in QUICK["arms"].values():  # one layer: the last layer type of the design stands for it
    if "layers" in _arm["model"]:
        _last = _arm["model"]["layers"]["pattern"][-1]
        _arm["model"]["layers"] = {"pattern": [_last], _last: _arm["model"]["layers"][_last]}

# The ablation experiment (``minilm.study.ablation``): variants of the study's models against
# references trained beside them, with the study's recipe and seeds (its rows placed as the study's, the answers'
# weight the study's share gives at L); perplexity only.
ABLATION_FULL, ABLATION_QUICK = (
    {
        **{k: copy.deepcopy(v) for k, v in study.items() if k in ("model", "data", "schemes", "seeds")},
        "train": {
            **study["train"],
            "retrieval_weight": weight_for_share(
                study["retrieval"]["answer_share"],
                study["model"]["block_size"],
                queries_for(study, study["model"]["block_size"]),
            ),
            "retrieval_queries": queries_for(study, study["model"]["block_size"]),
            "retrieval_spread": study["retrieval"]["spread"],
        },
        "experiment": "ablation",
        "ablation": {"groups": list(GROUPS), "multiples": multiples},
        "eval": {**study["eval"], "modes": ["nonoverlapping"]},
    }
    for study, multiples in ((FULL, [1, 2, 4]), (QUICK, [1, 2, 4]))
)
# The replication at L = 512 (issue #58): the frozen design on fresh seeds at 4x the training length, the kinds the
# claims read and NoPE, extended 512 -> 2048. Each run from scratch trains 1500 steps of 4 rows of 512, three times
# the L = 128 study's tokens: in 500 steps rope, sinusoidal, randomized and NoPE do not learn the spread task at 512
# (docs/guides/study.md, "Steps at 512 with the spread placement"). The answers keep their density and share of the
# loss (``retrieval``); xPos is not in it; the evaluation stops at 4L (the claims read L and 4L); no text-only twins
# or passkey (none of its claims reads them; they would double its fine-tuning at 2048). Its claims:
# registered/replication-512.yaml.
REPLICATION = copy.deepcopy(FULL)
REPLICATION.update(experiment="replication-512", seeds=[11, 12, 13, 14, 15], claim_seeds=[16, 17, 18])
REPLICATION["kinds"] = ["rope", "alibi", "sinusoidal", "t5", "randomized", "none"]
REPLICATION["controls"]["other_extensions"] = ["sinusoidal-pi"]  # learned is not among its kinds
REPLICATION["train"]["max_steps"] = 1500
# the oracle at 2048 is still learning the task at step 500 (the answers' loss 0.15-0.22 nats; 132 of 160 probes at
# a tuning seed) and learns it in 1000 (160 of 160): docs/guides/study.md. 4 rows of 2048 a step, 8.2M tokens.
REPLICATION["controls"]["oracle_steps_scale"] = 2 / 3
REPLICATION.pop("arms")
REPLICATION["model"]["block_size"] = 512
REPLICATION["replicates"] = "reports/length-generalization"  # its report's side-by-side verdicts read that record
REPLICATION["train"]["batch_size"] = 4
REPLICATION["tuning"]["seeds"] = [111, 112]
REPLICATION["schemes"] = {k: v for k, v in REPLICATION["schemes"].items() if k in REPLICATION["kinds"]}
REPLICATION["extension"].update(curve_multiples=[1, 2, 4], text_only=False, passkey_trials=0)  # its claims read neither
REPLICATION["eval"]["multiples"] = [1, 2, 4]
REPLICATION["retrieval"]["multiples"] = [1, 2, 4]
REPLICATION_QUICK = copy.deepcopy(QUICK)
REPLICATION_QUICK.update(experiment="replication-512", kinds=REPLICATION["kinds"])
REPLICATION_QUICK["controls"].update(other_extensions=["sinusoidal-pi"], oracle_steps_scale=2)
REPLICATION_QUICK["replicates"] = "out/length-generalization-quick"  # the quick study's default --out
REPLICATION_QUICK["extension"].update(text_only=False, passkey_trials=0)
REPLICATION_QUICK.pop("arms")
REPLICATION_QUICK["schemes"] = {k: v for k, v in QUICK["schemes"].items() if k in REPLICATION["kinds"]}
REPLICATION_QUICK["model"]["block_size"] = 64  # twice QUICK's 32, as 512 is to 128 (at 4x it would be the full's)
PLANS = {
    ("length-generalization", False): FULL,
    ("length-generalization", True): QUICK,
    ("replication-512", False): REPLICATION,
    ("replication-512", True): REPLICATION_QUICK,
    ("ablation", False): ABLATION_FULL,
    ("ablation", True): ABLATION_QUICK,
}
