"""``python -m minilm export CHECKPOINT DIR``: write a minilm checkpoint as a Hugging Face
model directory that ``transformers`` loads with no custom code (``minilm.hf.export``)."""
from __future__ import annotations

from minilm.checkpoints.loading import load_model
from minilm.cli import Parser, run_command
from minilm.hf import export as hf_export


def main(argv=None) -> int:
    parser = Parser(prog="minilm export", description=hf_export.__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint file or out_dir (or a Hugging Face directory, re-exported)")
    parser.add_argument("directory", help="the new directory to write (absent or empty)")
    parser.add_argument("--family", default=None, help="the transformers family to write (llama, gpt_neox, gpt2, "
                                                       "mpt, phi3; default: the first that holds the model; llama "
                                                       "writes Qwen2 or Qwen3 where the model has their options)")
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


def run(args) -> int:
    model, tokenizer, config, _ = load_model(args.checkpoint)
    done = hf_export.export_model(model, tokenizer, config, args.directory, family=args.family)
    print(f"exported {args.checkpoint} as {done['family']} ({done['params']:,} parameters) to {done['directory']}: "
          f"config.json, model.safetensors, tokenizer.json")
    return 0
