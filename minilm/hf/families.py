"""Every Hugging Face family minilm maps, in the order export tries them (the first whose
``exports`` accepts a model writes it). A new family is one file beside these and one entry here."""
from minilm.hf.gpt2 import GPT2
from minilm.hf.llama import LLAMA
from minilm.hf.mpt import MPT
from minilm.hf.neox import NEOX

FAMILIES = (LLAMA, NEOX, GPT2, MPT)
READERS = {model_type: family for family in FAMILIES for model_type in family.model_types}
