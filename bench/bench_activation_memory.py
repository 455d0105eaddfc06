"""Activation memory of one training forward pass with and without train.activation_checkpointing:
the bytes of the tensors autograd keeps for the backward pass (``common.saved_tensor_bytes``),
plus the time of forward + backward.

    python bench/bench_activation_memory.py [--block-size 1024] [--batch-size 8] [--config rope.yaml]

The model is the config's (the main job's by default) at --block-size; the numbers are per
process (per rank under torchrun, which splits the global batch)."""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from minilm import GPT  # noqa: E402
from minilm.common import saved_tensor_bytes  # noqa: E402
from minilm.configfile import load_config  # noqa: E402


def measure(model, idx, checkpointed: bool) -> tuple:
    model.checkpoint_blocks = checkpointed
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    saved, logits = saved_tensor_bytes(lambda: model(idx[:, :-1]))
    F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
    return saved, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="rope.yaml")
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    config = load_config(args.config, [f"model.block_size={args.block_size}"])
    config.model.vocab_size = config.data.vocab_size
    torch.manual_seed(0)
    model = GPT(config.model).train()
    idx = torch.randint(0, config.model.vocab_size, (args.batch_size, args.block_size + 1))
    measure(model, idx, False)  # warm-up
    print(
        f"{config.model.n_layer} layers x d_model {config.model.d_model}, batch {args.batch_size} x "
        f"{args.block_size} tokens, float32, torch {torch.__version__}"
    )
    for checkpointed in (False, True):
        saved, seconds = measure(model, idx, checkpointed)
        print(
            f"activation_checkpointing={str(checkpointed).lower():5s}: {saved / 2**20:8.1f} MiB kept for the "
            f"backward pass; forward + backward {seconds:.2f} s"
        )


if __name__ == "__main__":
    main()
