"""Text to tokens: corpora and prepared token files (``corpus``), the embedded plays
(``shakespeare``), minilm's sentencepiece tokenizer (``tokenizer``) and Hugging Face
tokenizers behind the same interface (``hf_tokenizer``)."""

from minilm.data.batches import get_batch
from minilm.data.corpus import prepare
from minilm.data.tokenizer import Tokenizer

__all__ = ["Tokenizer", "get_batch", "prepare"]
