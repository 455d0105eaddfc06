"""minilm: a minimal GPT whose positional encoding is a plug-in from a registry.

The package's face; docs/design.md maps the modules behind it."""

from minilm.checkpoints.loading import load_model
from minilm.config import Config, ModelConfig
from minilm.model.gpt import GPT

__all__ = ["GPT", "ModelConfig", "Config", "load_model"]
