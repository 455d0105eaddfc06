"""Batches: random windows of a token array, drawn from a torch generator (so saving its
state makes the sequence of batches resumable)."""

from __future__ import annotations

import numpy as np
import torch

from minilm.data.files import DataError


def get_batch(
    tokens, batch_size: int, block_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
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
        raise DataError(
            f"the split has {n} tokens, fewer than block_size + 1 = {block_size + 1}: "
            f"use a smaller block_size or more text"
        )
    starts = torch.randint(n - block_size, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(block_size + 1)
    if isinstance(tokens, torch.Tensor):
        rows = tokens[index].long()
    else:
        rows = torch.from_numpy(np.asarray(tokens[index.numpy()], dtype=np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class Documents:
    """Rows for long-context training (``data.min_document_tokens``): the documents of a token
    stream (each ending with its ``eot`` id), those shorter than ``min_tokens`` skipped, and rows
    that hold as few documents as they can. A row starts in a document drawn with probability
    proportional to its length; a document of at least block_size + 1 tokens holds the whole row
    (a start drawn uniformly inside it), a shorter one starts the row at its first token and the
    next documents kept fill the rest. So at an extended length most rows are one document,
    where windows of the plain stream would join several."""

    def __init__(self, tokens, eot: int, min_tokens: int):
        ends = np.flatnonzero(np.asarray(tokens) == eot)
        starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
        lengths = (ends + 1 - starts).astype(np.int64)  # each document with its eot
        keep = lengths >= max(min_tokens, 2)
        if not keep.any():
            raise DataError(
                f"data.min_document_tokens={min_tokens}: no document of the split has that many tokens "
                f"(the longest has {int(lengths.max()) if len(lengths) else 0}): lower it"
            )
        self.tokens, self.eot = tokens, eot
        self.starts, self.lengths = starts[keep], lengths[keep]
        self.ends = torch.from_numpy(np.cumsum(self.lengths))  # each kept document's end in the kept stream

    def batch(self, batch_size: int, block_size: int, generator: torch.Generator) -> tuple:
        """(x, y) of ``batch_size`` rows of ``block_size`` tokens, as ``get_batch`` gives them."""
        total, need = int(self.ends[-1]), block_size + 1
        picks = torch.searchsorted(self.ends, torch.randint(total, (batch_size,), generator=generator), right=True)
        offsets = (
            torch.rand(batch_size, generator=generator)
            * (torch.from_numpy(self.lengths)[picks] - need + 1).clamp(min=1)
        ).long()  # inside the document where it holds the row, else its start
        rows = []
        for doc, offset in zip(picks.tolist(), offsets.tolist()):
            pieces, have = [], 0
            while have < need:
                start = int(self.starts[doc]) + (offset if not pieces else 0)
                take = min(need - have, int(self.lengths[doc]) - (offset if not pieces else 0))
                pieces.append(np.asarray(self.tokens[start : start + take], dtype=np.int64))
                have += take
                doc = (doc + 1) % len(self.starts)
            rows.append(np.concatenate(pieces))
        rows = torch.from_numpy(np.stack(rows))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def crossing_rows(x: torch.Tensor, eot: int) -> int:
    """How many rows of ``x`` hold the end of a document (their targets run into the next one)."""
    return int((x == eot).any(dim=1).sum())
