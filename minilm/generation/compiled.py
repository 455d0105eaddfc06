"""A decode step compiled by ``torch.compile`` (opt-in: ``generate --compile``).

Batch-1 decoding on a CPU spends about a third of each token outside the matrix products:
dozens of small operations per layer, each dispatched from Python. Compiling ``GPT.body``
for one-token steps fuses them, and with a ``static`` KV cache (every step attends over all
its slots, the empty ones hidden by the causal mask) every step has the same shapes, so
the step is compiled once and never again (the approach of gpt-fast). On the CPU the
compiled step runs from C++ (inductor's ``cpp_wrapper``) with the weights frozen in
(``freezing``: prepacked for the matrix library), which is where most of the gain is.

Frozen weights would go stale if the model changed after compiling, so a compiled step is
kept per model together with the version counter of every parameter, and compiled again
if any of them moved. Compiling takes seconds to a minute, so it can pay off only for long
generations. In float32 the compiled step computes the same function in another order:
its logits agree with the eager step's to 1e-4 (tested), not bit for bit (the eager cache
stays exactly equal to ``--no-cache``).

On the CPU it does not pay off by default: the tokens it speeds up do not recover the compile
time within the generations it serves (``bench/bench_generate.py --break-even``;
docs/benchmarks.md, "Training step and decoding"), and a static cache is read whole at every
step, so the longer the generation the less each step gains.
"""

from __future__ import annotations

import weakref

import torch

_steps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> (parameter versions, compiled body)


def weight_versions(model: torch.nn.Module) -> tuple:
    """Identity and in-place-update counter of every parameter: changes whenever a weight does."""
    return tuple((id(p), p._version) for p in model.parameters())


def compiled_body(model: torch.nn.Module):
    """``model.body`` compiled for decoding (one per model and set of weights)."""
    versions = weight_versions(model)
    held = _steps.get(model)
    if held is not None and held[0] == versions:
        return held[1]
    options = {"freezing": True, "cpp_wrapper": True} if model.wte.weight.device.type == "cpu" else {}
    step = torch.compile(model.body, dynamic=False, options=options)
    _steps[model] = (versions, step)
    return step
