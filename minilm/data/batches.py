"""Batches: random windows of a token array, drawn from a torch generator (so saving its
state makes the sequence of batches resumable)."""
from __future__ import annotations

import numpy as np
import torch

from minilm.data.sources import DataError


def get_batch(tokens, batch_size: int, block_size: int,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` random sequences of ``block_size + 1`` tokens: inputs x and targets y.

    ``tokens`` is a 1-D array of ids (np.memmap/ndarray or tensor); the start positions
    come from ``generator`` (a CPU torch.Generator), so saving its state makes the
    sequence of batches resumable. Returns int64 CPU tensors of shape (batch_size, block_size).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size={batch_size!r} is invalid: expected an integer >= 1")
    if not isinstance(block_size, int) or block_size < 1:
        raise DataError(f"block_size={block_size!r} is invalid: expected an integer >= 1")
    n = len(tokens)
    if n < block_size + 1:
        raise DataError(f"the split has {n} tokens, fewer than block_size + 1 = {block_size + 1}: "
                        f"use a smaller block_size or more text")
    starts = torch.randint(n - block_size, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(block_size + 1)
    if isinstance(tokens, torch.Tensor):
        rows = tokens[index].long()
    else:
        rows = torch.from_numpy(np.asarray(tokens[index.numpy()], dtype=np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
