"""Checkpoints: the file format (``format``), rebuilding a model from one (``loading``), and
moving weights into a longer or re-scaled model (``extension``)."""

from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import Loaded, load_model

__all__ = ["CheckpointError", "Loaded", "load_model"]
