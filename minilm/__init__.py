"""minilm: a minimal GPT whose positional encoding is a plug-in from a registry."""
from minilm.config import Config, ModelConfig
from minilm.model import GPT

__all__ = ["GPT", "ModelConfig", "Config"]
