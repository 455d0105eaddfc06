"""``python -m minilm longeval CHECKPOINT [section.key=value ...]``: the long-context suite (RULER-style tasks of
``minilm.data.retrieval.suite_probe``: a single needle, several keys, several queries, several
values, variable tracking) over lengths x depths, generated from held-out text: the
checkpoint's validation split, or any text file (``--text``). Exact-match accuracy per cell
with its Wilson interval, a markdown table per task, a summary with depths pooled, and a
length x depth heatmap (``--figure``, with matplotlib). Marker, keys and values are token ids
the run's training split never uses (as its training rows chose them; an imported model's: those
the text never uses), so any checkpoint qualifies whose vocabulary leaves 65 of them."""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

from minilm.checkpoints.loading import load_model
from minilm.cli import LOADED, Parser, add_probe_grid, run_command, seed, smoke
from minilm.common import atomic_write, markdown_table, output_path
from minilm.config import DataConfig
from minilm.data import corpus as data
from minilm.data.retrieval import SUITE, RetrievalError, Task
from minilm.evaluation.retrieval import accuracy
from minilm.figures.canvas import check_figure_path
from minilm.hf.reading import is_hf_source
from minilm.study.figures import heatmap_figure
from minilm.study.stats import wilson
from minilm.training.outdir import check_writable

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def task_tokens(config, tokenizer, prepared, other_text: bool):
    """The training split the task's ids are chosen from (ids it never uses): a minilm run's own corpus's,
    as its training rows chose them, also when ``--text`` gives the haystacks; ``--text``'s own for a
    Hugging Face model (no corpus of its training is known) and where the run's corpus cannot be
    prepared here (said in a note: a run trained on the task may then be asked with other ids).
    ``prepared``: the haystacks' corpus, ``other_text`` when it is not the run's."""
    if not other_text:
        return prepared.train
    try:
        return data.prepare(config.data, quiet=True, tokenizer=tokenizer).train
    except data.DataError as exc:
        print(
            f"note: the run's corpus data.corpus={config.data.corpus!r} cannot be prepared here ({exc}): the "
            f"task's ids come from --text's text, not necessarily the ones the run trained on",
            file=sys.stderr,
        )
        return prepared.train


def main(argv=None) -> int:
    parser = Parser(prog="minilm longeval", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="checkpoint, out_dir, or Hugging Face model directory / hf:NAME")
    parser.add_argument("--tasks", default=",".join(SUITE), help=f"comma-separated (default: all: {','.join(SUITE)})")
    add_probe_grid(parser, DEPTHS, "the needle")
    parser.add_argument("--trials", type=int, default=20, help="probes per cell (default 20)")
    parser.add_argument("--items", type=int, default=4, help="keys, queries, values or hops of the tasks (default 4)")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument(
        "--text",
        default=None,
        help="a .txt file or directory to cut the haystacks from (default: the checkpoint's validation split)",
    )
    parser.add_argument("--figure", default=None, help="write the heatmaps to this .png")
    parser.add_argument("--csv", default=None, help="write every cell to this CSV")
    parser.take_settings(
        f"the checkpoint's {LOADED}", "model.position.scaling.type=yarn model.position.scaling.factor=4"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    args.trials = smoke.trials(args.trials)
    return run_command(lambda: run(args))


def run(args) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in SUITE]
    if unknown or not tasks:
        raise RetrievalError(f"--tasks {args.tasks!r} is invalid: valid: {', '.join(SUITE)}")
    depths = args.depths
    if args.trials < 1:
        raise RetrievalError(f"--trials {args.trials} is invalid: expected an integer >= 1")
    if args.figure:
        check_figure_path(args.figure)
    for option, path in (("--csv", args.csv), ("--figure", args.figure)):  # found before the work, not after it
        if path:
            check_writable(os.path.dirname(os.path.abspath(path)), option)
    model, tokenizer, config, _ = load_model(args.checkpoint, args.overrides)
    lengths = args.lengths or [config.model.block_size * m for m in (1, 2, 4)]
    source = config.data if args.text is None else DataConfig(corpus=args.text, dir=config.data.dir)
    prepared = data.prepare(source, quiet=True, tokenizer=tokenizer, announce=True)
    other_text = args.text is not None and not is_hf_source(args.checkpoint)  # an import has no corpus of its own
    task = Task.from_tokens(task_tokens(config, tokenizer, prepared, other_text), config.model.vocab_size)
    if len(prepared.val) <= max(lengths):
        raise RetrievalError(
            f"the held-out text has {len(prepared.val)} tokens, not more than the longest length "
            f"{max(lengths)}: give --text with more text or shorter --lengths"
        )
    rows, panels = [], []
    for name in tasks:
        with tqdm(
            total=len(lengths) * len(depths),
            desc=f"longeval {name}",
            unit="cell",
            file=sys.stderr,
            disable=args.quiet,
            leave=False,
        ) as bar:
            cells = accuracy(
                model,
                task,
                prepared.val,
                lengths,
                depths,
                trials=args.trials,
                seed=args.seed,
                name=name,
                items=args.items,
                progress=bar,
            )
        rows += [{"task": name, **c} for c in cells]
        found = {
            (c["length"], c["depth"]): None if c["correct"] is None else wilson(c["correct"], c["trials"])
            for c in cells
        }
        panels.append((name, lengths, depths, {cell: None if p is None else p.rate for cell, p in found.items()}))
        body = [
            [f"{d:g}"] + [found[(t, d)].format() if found[(t, d)] else "n/a (bounded)" for t in lengths] for d in depths
        ]
        pooled = [_pooled(cells, t) for t in lengths]
        chance = "text: no fixed chance" if name == "copy" else f"chance {100 * task.chance:.1f}% per answer"
        print(f"\n{name} ({args.trials} probes per cell, {chance})\n")
        print(
            markdown_table(["depth"] + [str(t) for t in lengths], body + [["all"] + pooled], "l" + "r" * len(lengths))
        )
    if args.csv:
        header = ["task", "length", "depth", "correct", "trials", "logprob"]
        atomic_write(  # an earlier file there is set aside and said so, never replaced (common.output_path)
            output_path(args.csv),
            "\n".join([",".join(header)] + [",".join("" if r[h] is None else str(r[h]) for h in header) for r in rows])
            + "\n",
            keep=True,
        )
        print(f"\ncells written to {args.csv}")
    if args.figure:
        path = heatmap_figure(
            panels,
            output_path(args.figure),
            f"long-context suite: {os.path.basename(args.checkpoint.rstrip('/'))}",
            columns=min(3, len(panels)),
        )
        print(f"heatmaps written to {path}")
    return 0


def _pooled(cells: list, length: int) -> str:
    these = [c for c in cells if c["length"] == length and c["correct"] is not None]
    if not these:
        return "n/a"
    return wilson(sum(c["correct"] for c in these), sum(c["trials"] for c in these)).format()
