"""Evaluation: held-out loss and evaluation segments (``scoring``), perplexity against length
(``lengths``) and passkey retrieval (``passkey``)."""

from minilm.evaluation.lengths import evaluate_checkpoints

__all__ = ["evaluate_checkpoints"]
