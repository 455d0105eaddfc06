"""The Hugging Face bridge: model directories read as checkpoints (``reading``) and models
written as model directories (``export``); one file per family maps both directions
(``gpt2``, ``neox``, ``llama`` with Qwen2 and Qwen3, ``phi3``, ``mpt``; the list is ``families``)."""

from minilm.hf.export import export_model
from minilm.hf.family import HFError
from minilm.hf.reading import read_hf

__all__ = ["HFError", "export_model", "read_hf"]
