"""``minilm generate`` (also ``python generate.py``, ``python -m minilm generate``): stream a
continuation of a prompt from a checkpoint.

    minilm generate --checkpoint out/rope "ROMEO:"
    echo "JULIET:" | minilm generate --checkpoint out/rope --temperature 0 --stats
    minilm generate --checkpoint out/rope "ROMEO:" model.position.scaling.type=dynamic \\
        model.position.scaling.factor=4 --max-context 1024

Load a checkpoint (``section.key=value`` arguments change its settings: a RoPE scaling, the
block size), read the prompt (argument, ``--prompt-file`` or stdin) or the prompts
(``--prompts-file``, one batch of different lengths), stream the samples
to stdout one after another, and write warnings, ``--stats`` and the attention map note to
stderr."""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from typing import List, Optional

import torch

from minilm.checkpoints.loading import load_model
from minilm.cli import LOADED, Parser, run_command, seed
from minilm.common import output_path, resolve_device, resolve_dtype
from minilm.figures import attention as attention_maps
from minilm.figures.canvas import check_figure_path
from minilm.generation.decode import GenerationError, GenerationWarning, Sampling, Stats, check_count, context_size
from minilm.generation.text import encode_prompt, generate
from minilm.model.cache import SINK_POSITIONS
from minilm.training.outdir import check_writable

SEPARATOR = "---------------"


class SamplePrinter:
    """Writes samples one after another: the first streams live, the others are buffered
    until it ends, then each in turn continues live. Every sample ends with a newline. Nothing
    is written before the first piece arrives, so an error found while setting up generation
    leaves stdout empty."""

    def __init__(self, out, heads: List[str]):
        self.out, self.heads, self.num_samples = out, heads, len(heads)
        self.buffers: dict = {}  # sample -> texts held back; made as samples speak, not up front
        self.done: set = set()
        self.current = 0
        self.started = False

    def _start(self) -> None:
        if not self.started:
            self.started = True
            self._write(self.heads[0])

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()

    def add(self, sample: int, text: str, done: bool) -> None:
        self._start()
        if sample == self.current:
            self._write(text)
        else:
            self.buffers.setdefault(sample, []).append(text)
        if done:
            self.done.add(sample)
        self._advance()

    def _advance(self, finished: bool = False) -> None:
        while self.current < self.num_samples and (finished or self.current in self.done):
            self._write("\n")
            self.current += 1
            if self.current < self.num_samples:
                self._write(f"{SEPARATOR}\n{self.heads[self.current]}{''.join(self.buffers.pop(self.current, []))}")

    def finish(self) -> None:
        self._start()
        self._advance(finished=True)


def read_prompt(prompt: Optional[str], prompt_file: Optional[str], stdin) -> str:
    """The prompt from the argument, ``--prompt-file``, or stdin (argument ``-``, or no
    argument while stdin is not a terminal); empty when none is given."""
    if prompt is not None and prompt_file is not None:
        raise GenerationError("give the prompt either as an argument or with --prompt-file, not both")
    if prompt_file is not None:
        try:
            with open(prompt_file, encoding="utf-8-sig") as f:  # a byte-order mark is no part of the prompt
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise GenerationError(
                f"cannot read --prompt-file {prompt_file!r}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
    if prompt == "-" or (prompt is None and stdin is not None and not stdin.isatty()):
        source = getattr(stdin, "buffer", None)
        data = source.read() if source is not None else stdin.read()
        return data if isinstance(data, str) else utf8(data, "the prompt on stdin")
    prompt = prompt or ""
    bad = [i for i, c in enumerate(prompt) if "\udc80" <= c <= "\udcff"]  # undecodable argv bytes
    if bad:
        raise GenerationError(
            f"the prompt argument is not valid UTF-8 (byte {ord(prompt[bad[0]]) - 0xDC00:#04x} at "
            f"character {bad[0]}): pass UTF-8 text, or use --prompt-file"
        )
    return prompt


def read_prompts(path: str) -> List[str]:
    """The prompts of ``--prompts-file``: one per line (blank lines skipped), or for a ``.jsonl``
    file (the extension in any case) one JSON string, or object with a "prompt" string, per line
    (prompts with line breaks); a UTF-8 byte-order mark at the start is left out."""
    try:
        with open(path, "rb") as f:
            text = utf8(f.read(), f"--prompts-file {path!r}").removeprefix("\ufeff")  # a byte-order mark
            lines = [line.removesuffix("\r") for line in text.split("\n")]
    except OSError as exc:
        raise GenerationError(f"cannot read --prompts-file {path!r}: {exc.strerror or exc}") from None
    if not path.lower().endswith(".jsonl"):  # in any case, as corpora: p.JSONL
        prompts = [line for line in lines if line.strip()]
    else:
        prompts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                item = None
            item = item.get("prompt") if isinstance(item, dict) else item
            if not isinstance(item, str):
                raise GenerationError(
                    f'--prompts-file {path!r} line {number}: expected a JSON string or an object with a "prompt" string'
                )
            prompts.append(item)
    if not prompts:
        raise GenerationError(f"--prompts-file {path!r} holds no prompt")
    return prompts


def utf8(data: bytes, what: str) -> str:
    """``data`` decoded as UTF-8, or a GenerationError naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GenerationError(
            f"{what} is not valid UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start}): convert it to UTF-8"
        ) from None


def unescape(text: str) -> str:
    """``\\n``, ``\\t`` and ``\\\\`` in a command-line string become a newline, a tab and a backslash."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


SAMPLING_ONLY = ("top_k", "top_p", "min_p")  # the filters of sampling, which greedy decoding does not read


def run_cli(args, stdin=None, stdout=None, stderr=None) -> None:
    """Load a checkpoint and stream continuations of a prompt: what ``generate.py`` runs with
    its parsed arguments. User errors raise a MinilmError (GenerationError, CheckpointError, ...)."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.repetition_penalty, args.min_p).check()
    unused = [
        f"--{name.replace('_', '-')} {getattr(args, name)}"
        for name in SAMPLING_ONLY
        if getattr(args, name) != getattr(Sampling(), name)
    ]
    if sampling.temperature == 0 and unused:  # greedy takes the likeliest token: the filters choose nothing
        print(f"note: {', '.join(unused)} do nothing with --temperature 0 (greedy)", file=stderr)
    check_count("--max-new-tokens", args.max_new_tokens, 0)
    check_count("--num-samples", args.num_samples, 1)
    if args.max_context is not None:
        check_count("--max-context", args.max_context, 1)
    if args.attention_map:  # a path that cannot be written is found before generating, not after
        check_figure_path(args.attention_map)
        check_writable(os.path.dirname(os.path.abspath(args.attention_map)), "--attention-map")
    device = resolve_device(args.device, setting="--device")
    if args.threads is not None:
        most = 4 * (os.cpu_count() or 1)  # more than this only queues threads (and a billion cannot be made)
        if not 1 <= args.threads <= most:
            raise GenerationError(
                f"--threads {args.threads} is invalid: expected 1 to {most} (this machine has {os.cpu_count()} CPUs)"
            )
        torch.set_num_threads(args.threads)
    if args.prompts_file is not None and (args.prompt is not None or args.prompt_file is not None):
        raise GenerationError("give prompts either with --prompts-file or as one prompt (argument, --prompt-file)")
    prompts = (
        read_prompts(args.prompts_file)
        if args.prompts_file is not None
        else [read_prompt(args.prompt, args.prompt_file, stdin)]
    )
    dtype = resolve_dtype(args.dtype, device, setting="--dtype")
    model, tokenizer, _, _ = load_model(args.checkpoint, args.overrides, device=device, dtype=dtype)
    rows = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    context = context_size(model, args.max_context)  # a bad --max-context fails before any output

    stats = Stats()
    printer = SamplePrinter(stdout, ["" if args.no_echo else p for p in prompts for _ in range(args.num_samples)])
    first_sample: List[int] = []  # its token ids, for the attention map
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GenerationWarning)
        pieces = generate(
            model,
            tokenizer,
            prompts=rows,
            max_new_tokens=args.max_new_tokens,
            sampling=sampling,
            num_samples=args.num_samples,
            seed=args.seed,
            stop=[unescape(s) for s in args.stop],
            max_context=args.max_context,
            use_cache=not args.no_cache,
            sinks=args.sink_tokens,
            sink_positions=args.sink_positions,
            stats=stats,
            compile=args.compile,
            stop_ids=() if args.ignore_eos else None,
        )
        first = True
        for piece in pieces:
            if first:  # the settings were good: the prefill ran; with --compile the next step compiles
                _show_warnings(caught, stderr)
                if args.compile and args.max_new_tokens > 1:
                    stderr.write("compiling the decode step (seconds to a minute) ...\n")
                    stderr.flush()
                first = False
            if piece.sample == 0:
                first_sample.append(piece.token)
            printer.add(piece.sample, piece.text, piece.done)
        _show_warnings(caught, stderr)
    printer.finish()
    if args.stats:
        mode = "no cache" if args.no_cache else "compiled step, static KV cache" if args.compile else "KV cache"
        kind = model.positions.kind
        stderr.write(
            f"model: {kind} positions, context {context}, {mode}, {device}, {str(dtype).replace('torch.', '')}\n"
        )
        for line in stats.lines():
            stderr.write(line + "\n")
    if args.attention_map:
        target = output_path(args.attention_map, say=lambda line: stderr.write(line + "\n"))  # an earlier file: kept
        path = attention_maps.attention_map(
            model,
            rows[0] + first_sample,
            tokenizer,
            target,
            context=context,
            sinks=args.sink_tokens,
            sink_positions=args.sink_positions,
        )
        stderr.write(f"attention map of sample 1 written to {path}\n")


def _show_warnings(caught: list, stderr) -> None:
    for w in caught:
        stderr.write(f"warning: {w.message}\n")
    caught.clear()


def parse_args(argv=None):
    p = Parser(
        prog="minilm generate",
        description="Generate text from a minilm checkpoint: prefill the prompt once, then decode "
        "one token at a time from the KV cache, streaming the text to stdout.",
    )
    p.add_argument(
        "prompt",
        nargs="?",
        default=None,
        help="the prompt; '-' or no prompt with stdin not a terminal reads stdin; empty starts from the BOS token",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="checkpoint file, an out_dir holding ckpt.pt, or a Hugging Face model directory / hf:NAME",
    )
    p.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    p.add_argument(
        "--prompts-file",
        metavar="FILE",
        help="many prompts, decoded together as one batch (each as it would be alone, greedy): one per "
        'line, or in a .jsonl file a JSON string or {"prompt": ...} per line; the samples are '
        "printed in order, --num-samples of each",
    )
    _sampling_options(p)
    _decoding_options(p)
    p.take_settings(
        f"the checkpoint's settings at generation time ({LOADED}; a prompt that looks like a setting goes after --)",
        "model.position.scaling.type=dynamic model.position.scaling.factor=4 model.block_size=1024",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: torch's choice); 1 is often fastest for batch-1 "
        "decoding of small models, and on a busy machine",
    )
    p.add_argument(
        "--attention-map",
        metavar="FILE.png",
        help="after generating, draw the last layer's attention over the first sample (in the generation's "
        "--max-context window, with its --sink-tokens)",
    )
    return p.parse_args(argv)


def _sampling_options(p) -> None:
    """How many tokens, drawn how: length, temperature and the filters, the seed and the batch."""
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate per sample (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens (default 200; 0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1 = off)")
    p.add_argument(
        "--min-p",
        type=float,
        default=0.0,
        help="drop tokens less likely than this fraction of the most likely one, in [0, 1] (default 0 = off)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="CTRL penalty for tokens already present, > 0 (default 1 = off)",
    )
    p.add_argument("--seed", type=seed, default=None, help="seed for reproducible samples (default: random)")
    p.add_argument("--num-samples", type=int, default=1, help="continuations decoded together as one batch")


def _decoding_options(p) -> None:
    """Where a sample stops, the context and the cache, and what is printed beside the text."""
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end a sample before this text (repeatable); the stop text is not printed; "
        "\\n and \\t mean newline and tab",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="go on past the end-of-text token (by default a sample ends there; for an imported model "
        "the eos_token_id of its generation_config.json, else of config.json: one id or a list)",
    )
    p.add_argument(
        "--max-context", type=int, default=None, help="tokens the model sees at once (default: the model's block_size)"
    )
    p.add_argument(
        "--sink-tokens",
        type=int,
        default=0,
        help="past the context, keep the first N tokens in view beside the last (attention sinks, "
        "StreamingLLM); for schemes that roll, not learned (default 0)",
    )
    p.add_argument(
        "--sink-positions",
        choices=SINK_POSITIONS,
        default=SINK_POSITIONS[0],
        help="where attention places the sinks: cache (their positions within the cache, as the paper "
        "does: the sinks stay max_context - 1 - s back) or absolute (their own positions, ever "
        "further back) (default %(default)s)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute the whole sequence at every step (same result, for comparison)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="decode with a static cache and a step compiled by torch.compile: faster per token "
        "after seconds to a minute of compiling (CPU: needs a C++ compiler)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default), bfloat16 (the weights kept in bf16: faster on CPUs with native bf16 "
        "units, emulated and slow elsewhere) or auto (bfloat16 where the hardware has fast bf16)",
    )
    p.add_argument("--no-echo", action="store_true", help="print only the continuation, not the prompt")
    p.add_argument(
        "--stats", action="store_true", help="print token counts, prefill and decode tokens/s and peak memory to stderr"
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_command(lambda: run_cli(args))
