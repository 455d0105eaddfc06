#!/usr/bin/env python
"""Stream a continuation of a prompt from a trained minilm checkpoint.

    python generate.py --checkpoint out/rope "ROMEO:"
    echo "JULIET:" | python generate.py --checkpoint out/rope --temperature 0 --stats
    python generate.py --checkpoint out/rope "ROMEO:" --set model.position.scaling.type=dynamic \\
        --set model.position.scaling.factor=4 --max-context 1024

The text goes to stdout as it is decoded; warnings, errors and --stats go to stderr.
This file only parses arguments; the work is minilm.cli.generate.run_cli.
"""
import sys

from minilm.cli import Parser, run_command
from minilm.cli.generate import run_cli
from minilm.model.cache import SINK_POSITIONS


def parse_args(argv=None):
    p = Parser(description="Generate text from a minilm checkpoint: prefill the prompt once, then decode "
                           "one token at a time from the KV cache, streaming the text to stdout.")
    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt; '-' or no prompt with stdin not a terminal reads stdin; "
                        "empty starts from the BOS token")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint file, an out_dir holding ckpt.pt, or a Hugging Face model directory / hf:NAME")
    p.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate per sample (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens (default 200)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1 = off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens less likely than this fraction of the most likely one, in [0, 1] (default 0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="CTRL penalty for tokens already present, > 0 (default 1 = off)")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible samples (default: random)")
    p.add_argument("--num-samples", type=int, default=1, help="continuations decoded together as one batch")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end a sample before this text (repeatable); the stop text is not printed; "
                        "\\n and \\t mean newline and tab")
    p.add_argument("--ignore-eos", action="store_true",
                   help="go on past the end-of-text token (by default a sample ends there; for an imported model "
                        "the eos_token_id of its generation_config.json, else of config.json: one id or a list)")
    p.add_argument("--max-context", type=int, default=None,
                   help="tokens the model sees at once (default: the model's block_size)")
    p.add_argument("--sink-tokens", type=int, default=0,
                   help="past the context, keep the first N tokens in view beside the last (attention sinks, "
                        "StreamingLLM); for schemes that roll, not learned (default 0)")
    p.add_argument("--sink-positions", choices=SINK_POSITIONS, default=SINK_POSITIONS[0],
                   help="where attention places the sinks: cache (their positions within the cache, as the paper "
                        "does: the sinks stay max_context - 1 - s back) or absolute (their own positions, ever "
                        "further back) (default %(default)s)")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute the whole sequence at every step (same result, for comparison)")
    p.add_argument("--compile", action="store_true",
                   help="decode with a static cache and a step compiled by torch.compile: faster per token "
                        "after seconds to a minute of compiling (CPU: needs a C++ compiler)")
    p.add_argument("--dtype", default="float32",
                   help="float32 (default), bfloat16 (the weights kept in bf16: faster on CPUs with native bf16 "
                        "units, emulated and slow elsewhere) or auto (bfloat16 where the hardware has fast bf16)")
    p.add_argument("--no-echo", action="store_true", help="print only the continuation, not the prompt")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change the position settings at generation time, e.g. "
                        "model.position.scaling.type=dynamic, model.position.scaling.factor=4, "
                        "model.block_size=1024 (repeatable; values parsed as YAML)")
    p.add_argument("--stats", action="store_true",
                   help="print token counts, prefill and decode tokens/s and peak memory to stderr")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice); 1 is often fastest for batch-1 "
                        "decoding of small models, and on a busy machine")
    p.add_argument("--attention-map", metavar="FILE.png",
                   help="after generating, draw the last layer's attention over the first sample")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_command(lambda: run_cli(args))


if __name__ == "__main__":
    sys.exit(main())
