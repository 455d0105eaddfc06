"""Generation: sampling and the prefill / decode loop (``decode``), and the decode step
compiled by torch.compile (``compiled``)."""

from minilm.generation.decode import Sampling, generate_ids
from minilm.generation.text import generate, generate_text

__all__ = ["Sampling", "generate", "generate_ids", "generate_text"]
