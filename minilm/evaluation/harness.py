"""Any minilm checkpoint as a model of lm-evaluation-harness (``lm_eval``, EleutherAI):
registered there as ``minilm``, so its tasks score every position scheme, trained or
imported, with evaluation-time overrides (a zero-shot rope scaling, say).

    python -m minilm lmeval CHECKPOINT --tasks hellaswag [model.position.scaling.type=yarn ...]

The three request types, as lm_eval's own Hugging Face model (``HFLM``) serves them, so that an
exported model scores the same through either (tested to 1e-4 per request):

* ``loglikelihood(context, continuation)``: lm_eval's ``TemplateLM`` encodes the pair (trailing
  spaces of the context move to the continuation; the continuation's ids are those of the
  whole text past the context's; an empty context is the begin-of-text token); the model reads ``(context +
  continuation)[-(max_length + 1):-1]``
  and the result is the sum of the continuation's log-probabilities and whether each of its
  tokens is the argmax.
* ``loglikelihood_rolling(text)``: the text in disjoint windows of ``max_length`` tokens, the
  first one after the begin-of-text token (lm_eval's ``get_rolling_token_windows``), summed.
* ``generate_until(context, {until, max_gen_toks, ...})``: greedy unless ``do_sample`` (then the
  task's temperature, top_k, top_p and min_p), from the last ``max_length - max_gen_toks`` tokens
  of the context, in a window of ``max_length``, cut at the first stop string or end-of-text token
  (``minilm.generation.text.generate``).

``max_length`` is the model's context (block_size) unless given. Requests are scored a batch
at a time, longest first, padded on the right (causal attention never reads the padding). A
scheme that reads the pass's length (dynamic NTK, LongRoPE) sees the batch's padded length, so
its scores move with ``--batch-size``, as transformers' own model under lm_eval does: give
``--batch-size 1`` for scores of each request alone.
Needs ``pip install -e ".[eval]"``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from minilm.checkpoints.loading import load_model
from minilm.common import MinilmError, resolve_device
from minilm.generation.decode import Sampling, context_size
from minilm.generation.text import generate

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError:  # the optional extra is missing: the adapter says so when it is asked for
    TemplateLM = None

INSTALL = (
    'lm-evaluation-harness is not installed: pip install "lm_eval>=0.4.5" (from a clone: pip install -e ".[eval]")'
)


class HarnessError(MinilmError):
    """The adapter cannot run; the message is one line."""


def require() -> None:
    if TemplateLM is None:
        raise HarnessError(INSTALL)


if TemplateLM is not None:

    @register_model("minilm")
    class MinilmLM(TemplateLM):
        """lm_eval's model interface over ``load_model(checkpoint, overrides)``."""

        def __init__(
            self,
            checkpoint: str,
            overrides: Sequence[str] = (),
            batch_size=1,
            max_length: Optional[int] = None,
            max_gen_toks: int = 256,
            device: str = "cpu",
            **_,
        ):
            super().__init__()
            if isinstance(overrides, str):  # from lm_eval's "key=value,..." model_args: ';'-separated
                overrides = [o for o in overrides.split(";") if o]
            self.model, self.tokenizer_, self.config, _ = load_model(
                checkpoint, list(overrides), device=resolve_device(device)
            )
            self.model.eval()
            self._max_length = context_size(self.model, None if max_length is None else int(max_length))
            self.batch_size = max(1, int(batch_size)) if str(batch_size).isdigit() else 1
            self.max_gen_toks = int(max_gen_toks)
            self._device = next(self.model.parameters()).device

        @property
        def eot_token_id(self) -> int:
            tok = self.tokenizer_
            eot = tok.eos_id if tok.eos_id is not None else tok.bos_id
            if eot is None:
                raise HarnessError(
                    "the tokenizer has neither an end-of-text nor a begin-of-text token, which "
                    "lm_eval puts before a text it scores from its start"
                )
            return eot

        @property
        def prefix_token_id(self) -> int:
            """What an empty context is scored after: the begin-of-text token, else the end-of-text one (as HFLM)."""
            return self.tokenizer_.bos_id if self.tokenizer_.bos_id is not None else self.eot_token_id

        @property
        def max_length(self) -> int:
            return self._max_length

        def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list:
            return self.tokenizer_.encode(string)

        def tok_decode(self, tokens, **kwargs) -> str:
            return self.tokenizer_.decode(tokens)

        @torch.no_grad()
        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list:
            out = [None] * len(requests)
            order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1] + requests[i][2]))
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                inputs = [(requests[i][1] + requests[i][2])[-(self.max_length + 1) :][:-1] for i in batch]
                width = max(len(x) for x in inputs)
                ids = torch.zeros(len(batch), width, dtype=torch.long)
                for row, x in enumerate(inputs):
                    ids[row, : len(x)] = torch.tensor(x)
                logprobs = F.log_softmax(self.model(ids.to(self._device)).float(), dim=-1).cpu()
                for row, i in enumerate(batch):
                    continuation = torch.tensor(requests[i][2])
                    n, end = len(continuation), len(inputs[row])
                    scores = logprobs[row, end - n : end]
                    picked = scores.gather(1, continuation[:, None]).squeeze(1)
                    out[i] = (float(picked.sum()), bool((scores.argmax(dim=-1) == continuation).all()))
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list:
            totals = []
            for (text,) in [r.args for r in requests]:
                windows = [
                    make_disjoint_window(w)
                    for w in get_rolling_token_windows(
                        token_list=self.tok_encode(text),
                        prefix_token=self.prefix_token_id,
                        max_seq_len=self.max_length,
                        context_len=1,
                    )
                ]
                totals.append(sum(s for s, _ in self._loglikelihood_tokens([(None, *w) for w in windows])))
            return totals

        def generate_until(self, requests, disable_tqdm: bool = False) -> list:
            texts = []
            for context, settings in [r.args for r in requests]:
                settings = dict(settings or {})
                until = settings.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                new = int(settings.get("max_gen_toks", self.max_gen_toks))
                sampling = (  # the task's filters as transformers reads them (unset: off)
                    Sampling(
                        temperature=float(settings.get("temperature", 1.0)),
                        top_k=settings.get("top_k"),
                        top_p=float(settings.get("top_p", 1.0)),
                        min_p=float(settings.get("min_p", 0.0)),
                    )
                    if settings.get("do_sample")
                    else Sampling(temperature=0)
                )
                prompt = self.tok_encode(context)[-max(1, self.max_length - new) :] or [self.prefix_token_id]
                pieces = generate(  # the window the loglikelihood requests read: max_length tokens
                    self.model,
                    self.tokenizer_,
                    prompt,
                    max_new_tokens=new,
                    sampling=sampling,
                    stop=until,
                    seed=0,
                    max_context=self.max_length,
                )
                texts.append("".join(p.text for p in pieces))
            return texts


def evaluate(
    checkpoint: str,
    tasks: Sequence[str],
    *,
    overrides: Sequence[str] = (),
    limit=None,
    batch_size: int = 1,
    max_length: Optional[int] = None,
    num_fewshot: Optional[int] = None,
    include_path: Optional[str] = None,
    device: str = "cpu",
) -> dict:
    """lm_eval's ``simple_evaluate`` of a checkpoint on ``tasks``; its results dict."""
    require()
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    model = MinilmLM(checkpoint, overrides, batch_size=batch_size, max_length=max_length, device=device)
    manager = None
    if include_path:  # tasks of one's own only: lm_eval's few thousand need not be indexed (seconds)
        manager = TaskManager(include_path=include_path, include_defaults=False)
        manager = manager if all(t in manager.all_tasks for t in tasks) else None
    manager = manager or TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise HarnessError(
            f"task {unknown[0]!r} is not one lm_eval knows"
            f"{' (nor under ' + repr(include_path) + ')' if include_path else ''}: see `lm_eval ls tasks`"
        )
    return simple_evaluate(
        model=model,
        tasks=list(tasks),
        limit=limit,
        num_fewshot=num_fewshot,
        task_manager=manager,
        bootstrap_iters=0,
        log_samples=False,
    )
