"""A decode step compiled by ``torch.compile`` (``generate`` picks it where it pays off; ``--compile``
forces it, ``--no-compile`` refuses it).

Batch-1 decoding on a CPU spends about a third of each token outside the matrix products:
dozens of small operations per layer, each dispatched from Python. Compiling ``GPT.body``
for one-token steps fuses them, and with a ``static`` KV cache (every step attends over all
its slots, the empty ones hidden by the causal mask) every step has the same shapes, so
the step is compiled once and never again (the approach of gpt-fast). On the CPU the
compiled step runs from C++ (inductor's ``cpp_wrapper``) with the weights frozen in
(``freezing``: prepacked for the matrix library), which is where most of the gain is.

Frozen weights would go stale if the model changed after compiling, so a compiled step is
kept per model together with the version counter of every parameter, and compiled again
if any of them moved. Compiling takes seconds to a minute, so it pays off for long
generations. In float32 the compiled step computes the same function in another order:
its logits agree with the eager step's to 1e-4 (tested), not bit for bit (the eager cache
stays exactly equal to ``--no-cache``).

It pays off when the tokens it speeds up recover the compile time: ``BREAK_EVEN`` new tokens
(``pays_off``), measured with ``bench/bench_generate.py --break-even`` (README, "Generating").
"""
from __future__ import annotations

import os
import shutil
import weakref

import torch

# New tokens per sequence from which compiling the decode step saves time overall, with a cold
# compile cache (the first compile of a shape; later ones reuse inductor's cache and take less):
# compile seconds / (eager - compiled seconds per token), measured (docs/design.md, "Measured choices").
BREAK_EVEN = 20_000

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


def compiler_present(device: torch.device) -> bool:
    """Whether ``torch.compile`` can build a step for ``device``: a C++ compiler on the CPU (inductor
    writes C++), CUDA as it comes (Triton ships with torch's CUDA builds); not other devices."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    return any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if name)


def pays_off(device: torch.device, new_tokens: int, fits: bool) -> bool:
    """Whether to compile the decode step when not told: ``new_tokens`` per sequence at least
    ``BREAK_EVEN``, a compiler present, and a generation that ``fits`` the compiled step's
    static cache (one prompt length, no sliding window, no sinks)."""
    return fits and new_tokens >= BREAK_EVEN and compiler_present(device)
