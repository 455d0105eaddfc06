"""``python -m minilm export CHECKPOINT DIR [--adapter]``: write a minilm checkpoint as a Hugging Face
model directory that ``transformers`` loads with no custom code (``minilm.hf.export``; a LoRA run's
adapters merged), or with ``--adapter`` a LoRA run's adapters in peft's format (``minilm.hf.peft``)."""

from __future__ import annotations

from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import load_model, lora_base, read_checkpoint
from minilm.cli import Parser, run_command
from minilm.hf import export as hf_export
from minilm.hf.families import BY_NAME
from minilm.hf.peft import export_adapter


def main(argv=None) -> int:
    parser = Parser(prog="minilm export", description=hf_export.__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint file or out_dir (or a Hugging Face directory, re-exported)")
    parser.add_argument("directory", help="the new directory to write (absent or empty)")
    parser.add_argument(
        "--family",
        default=None,
        help=f"the transformers family to write ({', '.join(BY_NAME)}; default: the first that holds the model "
        "and runs its rope as minilm does; llama writes Qwen2 or Qwen3 where the model has their options)",
    )
    parser.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA run: write its adapters (and also_train parameters) in peft's format, "
        "adapter_config.json and adapter_model.safetensors, for its Llama-family or GPT-NeoX base",
    )
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


def run(args) -> int:
    if args.adapter:
        return run_adapter(args)
    model, tokenizer, config, _ = load_model(args.checkpoint)
    done = hf_export.export_model(model, tokenizer, config, args.directory, family=args.family)
    print(
        f"exported {args.checkpoint} as {done['family']} ({done['params']:,} parameters) to {done['directory']}: "
        f"config.json, model.safetensors, tokenizer.json"
    )
    return 0


def run_adapter(args) -> int:
    state = read_checkpoint(args.checkpoint)
    if "lora_base" not in state:
        raise CheckpointError(
            f"--adapter: {args.checkpoint!r} is not a LoRA run's checkpoint (train.lora.r > 0); "
            f"without --adapter the whole model is exported"
        )
    config = load_model(args.checkpoint).config
    base = lora_base(read_checkpoint(args.checkpoint))
    done = export_adapter(
        state["model"], config, base.model.state_dict(), base.state["path"], args.directory, family=args.family
    )
    print(
        f"exported the adapters of {args.checkpoint} for its {done['family']} base {base.state['path']} "
        f"({done['tensors']} tensors) to {done['directory']}: adapter_config.json, adapter_model.safetensors"
    )
    if base.config.model.position != config.model.position or base.config.model.block_size != config.model.block_size:
        print(
            f"note: the run changed the base's positions (to {config.model.position}, block_size "
            f"{config.model.block_size}): load the base with those settings for the adapters to compute what the "
            f"run trained, or export the merged model (without --adapter)"
        )
    return 0
