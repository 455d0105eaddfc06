"""Every Hugging Face family minilm maps, in the order export tries them (the first whose
``exports`` accepts a model writes it, unless the export names one). A new family is one file
beside these and one entry here."""

from minilm.hf.cohere import COHERE
from minilm.hf.exaone import EXAONE
from minilm.hf.gemma import GEMMA
from minilm.hf.gpt2 import GPT2
from minilm.hf.llama import LLAMA
from minilm.hf.mpt import MPT
from minilm.hf.neox import NEOX
from minilm.hf.olmo import OLMO
from minilm.hf.phi3 import PHI3

FAMILIES = (LLAMA, GEMMA, EXAONE, OLMO, NEOX, GPT2, MPT, PHI3, COHERE)
READERS = {model_type: family for family in FAMILIES for model_type in family.model_types}
BY_NAME = {family.model_types[0]: family for family in FAMILIES if family.write}  # what ``export --family`` takes
