"""``python -m minilm lmeval CHECKPOINT --tasks T[,T...] [section.key=value ...]``: lm-evaluation-harness
tasks on any checkpoint (``minilm.evaluation.harness``), its settings changed by ``section.key=value``
arguments (a RoPE scaling, say); prints lm_eval's table."""

from __future__ import annotations

from minilm.cli import LOADED, Parser, run_command
from minilm.evaluation import harness


def main(argv=None) -> int:
    parser = Parser(prog="minilm lmeval", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="checkpoint, out_dir, or Hugging Face model directory / hf:NAME")
    parser.add_argument("--tasks", required=True, help="comma-separated lm_eval task names")
    parser.add_argument("--include-path", default=None, help="a folder of task YAML files of your own")
    parser.add_argument("--limit", type=float, default=None, help="documents per task (or a fraction)")
    parser.add_argument("--num-fewshot", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=None, help="tokens the model reads (default: block_size)")
    parser.add_argument("--device", default="cpu")
    parser.take_settings(
        f"the checkpoint's {LOADED}", "model.position.scaling.type=yarn model.position.scaling.factor=4"
    )
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


def run(args) -> int:
    harness.require()
    from lm_eval.utils import make_table  # the optional extra, there once require() has passed

    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    results = harness.evaluate(
        args.checkpoint,
        [t for t in args.tasks.split(",") if t],
        overrides=args.overrides,
        limit=limit,
        batch_size=args.batch_size,
        max_length=args.max_length,
        num_fewshot=args.num_fewshot,
        include_path=args.include_path,
        device=args.device,
    )
    print(make_table(results))
    return 0
