"""What ``generate.py`` does with its parsed arguments: load a checkpoint, read the prompt
(argument, ``--prompt-file`` or stdin), stream the samples to stdout one after another,
and write warnings, ``--stats`` and the attention map note to stderr."""
from __future__ import annotations

import os
import re
import sys
import warnings
from typing import List, Optional

import torch

from minilm.checkpoints.loading import load_model
from minilm.common import resolve_device, resolve_dtype
from minilm.figures import attention as attention_maps
from minilm.figures.canvas import check_figure_path
from minilm.generation.decode import GenerationError, GenerationWarning, Sampling, Stats, check_count, context_size
from minilm.generation.text import encode_prompt, generate
from minilm.training.outdir import check_writable

SEPARATOR = "---------------"


class SamplePrinter:
    """Writes samples one after another: the first streams live, the others are buffered
    until it ends, then each in turn continues live. Every sample ends with a newline. Nothing
    is written before the first piece arrives, so an error found while setting up generation
    leaves stdout empty."""

    def __init__(self, out, num_samples: int, head: str):
        self.out, self.head, self.num_samples = out, head, num_samples
        self.buffers: dict = {}  # sample -> texts held back; made as samples speak, not up front
        self.done: set = set()
        self.current = 0
        self.started = False

    def _start(self) -> None:
        if not self.started:
            self.started = True
            self._write(self.head)

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
                self._write(f"{SEPARATOR}\n{self.head}{''.join(self.buffers.pop(self.current, []))}")

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
            with open(prompt_file, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise GenerationError(f"cannot read --prompt-file {prompt_file!r}: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from None
    if prompt == "-" or (prompt is None and stdin is not None and not stdin.isatty()):
        source = getattr(stdin, "buffer", None)
        data = source.read() if source is not None else stdin.read()
        return data if isinstance(data, str) else utf8(data, "the prompt on stdin")
    prompt = prompt or ""
    bad = [i for i, c in enumerate(prompt) if "\udc80" <= c <= "\udcff"]  # undecodable argv bytes
    if bad:
        raise GenerationError(f"the prompt argument is not valid UTF-8 (byte {ord(prompt[bad[0]]) - 0xdc00:#04x} at "
                              f"character {bad[0]}): pass UTF-8 text, or use --prompt-file")
    return prompt


def utf8(data: bytes, what: str) -> str:
    """``data`` decoded as UTF-8, or a GenerationError naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GenerationError(f"{what} is not valid UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start}): "
                              f"convert it to UTF-8") from None


def unescape(text: str) -> str:
    """``\\n``, ``\\t`` and ``\\\\`` in a command-line string become a newline, a tab and a backslash."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def run_cli(args, stdin=None, stdout=None, stderr=None) -> None:
    """Load a checkpoint and stream continuations of a prompt: what ``generate.py`` runs with
    its parsed arguments. User errors raise a MinilmError (GenerationError, CheckpointError, ...)."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.repetition_penalty, args.min_p).check()
    check_count("--max-new-tokens", args.max_new_tokens, 0)
    check_count("--num-samples", args.num_samples, 1)
    if args.max_context is not None:
        check_count("--max-context", args.max_context, 1)
    if args.attention_map:  # a path that cannot be written is found before generating, not after
        check_figure_path(args.attention_map)
        check_writable(os.path.dirname(os.path.abspath(args.attention_map)), "--attention-map")
    device = resolve_device(args.device, setting="--device")
    if args.threads is not None:
        check_count("--threads", args.threads, 1)
        torch.set_num_threads(args.threads)
    prompt = read_prompt(args.prompt, args.prompt_file, stdin)
    dtype = resolve_dtype(args.dtype, device, setting="--dtype")
    model, tokenizer, _, _ = load_model(args.checkpoint, args.set, device=device, dtype=dtype)
    prompt_ids = encode_prompt(tokenizer, prompt)
    context = context_size(model, args.max_context)  # a bad --max-context fails before any output

    stats = Stats()
    printer = SamplePrinter(stdout, args.num_samples, "" if args.no_echo else prompt)
    first_sample: List[int] = []  # its token ids, for the attention map
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GenerationWarning)
        pieces = generate(model, tokenizer, prompt_ids, max_new_tokens=args.max_new_tokens, sampling=sampling,
                          num_samples=args.num_samples, seed=args.seed, stop=[unescape(s) for s in args.stop],
                          max_context=args.max_context, use_cache=not args.no_cache, sinks=args.sink_tokens,
                          sink_positions=args.sink_positions,
                          stats=stats, compile=args.compile, stop_ids=() if args.ignore_eos else None)
        first = True
        for piece in pieces:
            if first:
                _show_warnings(caught, stderr)
                first = False
            if piece.sample == 0:
                first_sample.append(piece.token)
            printer.add(piece.sample, piece.text, piece.done)
        _show_warnings(caught, stderr)
    printer.finish()
    if args.stats:
        mode = "no cache" if args.no_cache else "compiled step, static KV cache" if args.compile else "KV cache"
        kind = model.positions.kind
        stderr.write(f"model: {kind} positions, context {context}, {mode}, "
                     f"{device}, {str(dtype).replace('torch.', '')}\n")
        for line in stats.lines():
            stderr.write(line + "\n")
    if args.attention_map:
        path = attention_maps.attention_map(model, prompt_ids + first_sample, tokenizer, args.attention_map)
        stderr.write(f"attention map of sample 1 written to {path}\n")


def _show_warnings(caught: list, stderr) -> None:
    for w in caught:
        stderr.write(f"warning: {w.message}\n")
    caught.clear()
