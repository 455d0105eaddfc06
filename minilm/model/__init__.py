"""The model: GPT (``gpt``) and its KV cache (``cache``)."""

from minilm.model.cache import KVCache
from minilm.model.gpt import GPT

__all__ = ["GPT", "KVCache"]
