"""The extension arm of the length-generalization study: rope's scaling methods, the other
schemes' extensions by position interpolation, the keep-training control, their names in the
report, and the evaluation-time overrides that apply a method to its source zero-shot (step 0).

With ``extension.text_only`` every row has a twin, ``<row> text-only`` (``text_only_label``): the same
fine-tuning with no retrieval rows in its data (``minilm.study.papers``), beside it in every table."""

from __future__ import annotations

import math

import yaml

METHOD_NAMES = {
    "none": "no scaling",
    "linear": "PI (linear)",
    "ntk": "NTK-aware",
    "dynamic": "dynamic NTK",
    "yarn": "YaRN",
    "llama3": "llama3",
}
# extensions of the other schemes that have one (position interpolation of a table or of sin/cos),
# and the control that keeps training at L with the fine-tuning's tokens
OTHER_EXTENSIONS = {"learned-pi": ("learned", "learned + PI"), "sinusoidal-pi": ("sinusoidal", "sinusoidal + PI")}
CONTROL_NAMES = {"keep": "rope, training kept at L"}
LABEL_NAMES = {**METHOD_NAMES, **{k: name for k, (_, name) in OTHER_EXTENSIONS.items()}, **CONTROL_NAMES}
TEXT_ONLY = " text-only"  # the suffix of a row's text-only twin: its label, and its name in the report
LABEL_NAMES.update({f"{label}{TEXT_ONLY}": f"{name},{TEXT_ONLY}" for label, name in list(LABEL_NAMES.items())})


def text_only_label(label: str) -> str:
    """The label of extension row ``label``'s text-only twin (the same fine-tuning without retrieval rows)."""
    return f"{label}{TEXT_ONLY}"


def twin_of(label: str) -> str:
    """The row a text-only row is the twin of (any other row: itself)."""
    return label[: -len(TEXT_ONLY)] if label.endswith(TEXT_ONLY) else label


def is_text_only(label: str) -> bool:
    return label.endswith(TEXT_ONLY)


def interpolated_position(name: str, factor: float) -> dict:
    """The position setting of ``OTHER_EXTENSIONS`` ``name``: its kind inside interpolated. A learned
    table leaves the factor to be computed, (block_size - 1) / (rows - 1), so that the last position
    lands on the last trained row (factor x L would leave the last positions past the table);
    sinusoidal takes ``factor``."""
    kind = OTHER_EXTENSIONS[name][0]
    return {"kind": "interpolated", "inner": {"kind": kind}, **({} if kind == "learned" else {"factor": factor})}


def scaling_override(method: str, factor: float, length: int = 0) -> list:
    """The evaluation-time overrides that apply extension ``method`` to its source checkpoint
    zero-shot, as at ``length`` tokens (rope's scaling methods; learned or sinusoidal inside
    interpolated for ``OTHER_EXTENSIONS``; nothing for no scaling and the keep-training control); a
    text-only row's are its twin's (the same source, the same method: the same step 0)."""
    method = twin_of(method)
    if method in OTHER_EXTENSIONS:
        position = interpolated_position(method, factor)
        text = yaml.safe_dump(position, default_flow_style=True, sort_keys=False).strip()
        return [f"model.position={text}"] + ([] if "factor" in position else [f"model.block_size={length}"])
    return [] if method in ("none", "keep") else [f"model.position.scaling={{type: {method}, factor: {factor}}}"]


def extension_labels(plan: dict, text_only: bool = True) -> list:
    """The rows of the extension's tables: the plan's methods, the other schemes' extensions and
    the keep-training control it runs, each followed by its text-only twin when the plan's
    ``extension.text_only`` is on and ``text_only`` asks for them (False: the rows the sweep tunes)."""
    controls = plan.get("controls", {})
    rows = [
        *plan["extension"]["methods"],
        *controls.get("other_extensions", []),
        *(["keep"] if controls.get("keep_training") else []),
    ]
    twins = text_only and plan["extension"].get("text_only")
    return [label for row in rows for label in ([row, text_only_label(row)] if twins else [row])]


def extension_runs(plan: dict, text_only: bool = False) -> dict:
    """Every extension row's run: label -> (the kind it starts from, its position setting, its
    ``run_config`` keywords: the extended block size; the keep-training control's rows of L,
    factor x as many per step for the same tokens). The rows the sweep tunes; with ``text_only``
    their text-only twins too (``extension_labels``), each with its twin's run."""
    f, L = plan["extension"]["factor"], plan["model"]["block_size"]
    runs = {}
    for row in extension_labels(plan, text_only):
        label = twin_of(row)
        if label in OTHER_EXTENSIONS:
            runs[row] = (OTHER_EXTENSIONS[label][0], interpolated_position(label, f), {"block_size": int(f * L)})
        elif label == "keep":
            runs[row] = ("rope", {"kind": "rope"}, {"block_size": L, "batch_scale": f})
        else:
            scaling = {"scaling": {"type": label, "factor": f}} if label != "none" else {}
            runs[row] = ("rope", {"kind": "rope", **scaling}, {"block_size": int(f * L)})
    return runs


def extension_run_name(label: str, seed: int, plan: dict) -> str:
    """The run directory's name of extension row ``label`` at ``seed`` (a text-only twin: its twin's with
    ``-text-only`` before the seed)."""
    f, L, text = plan["extension"]["factor"], plan["model"]["block_size"], "-text-only" if is_text_only(label) else ""
    label = twin_of(label)
    if label == "keep":
        return f"rope-keep-{L}{text}-s{seed}"
    return f"{'rope-' if label in METHOD_NAMES else ''}{label}-{int(f * L)}{text}-s{seed}"


def oracle_runs(plan: dict) -> list:
    """(kind, label, batch scale) of the oracle controls, trained from scratch at factor x L: each
    kind of ``controls.oracle`` with ``oracle_batch_scale`` x the pretraining's rows per step (1: its
    sequences, factor x its tokens), and with ``oracle_equal_tokens`` the same kind on the
    pretraining's tokens (1 / factor x the rows), label ``<kind>-equal-tokens``, which then takes the
    extension's fine-tuning (``Study._oracle``): the extension's tokens and steps."""
    controls, f = plan.get("controls", {}), plan["extension"]["factor"]
    runs = [(kind, kind, controls.get("oracle_batch_scale", 1.0)) for kind in controls.get("oracle", [])]
    return runs + [
        (kind, f"{kind}-equal-tokens", 1 / f)
        for kind in controls.get("oracle", [])
        if controls.get("oracle_equal_tokens")
    ]


def oracle_steps(plan: dict) -> int:
    """Steps of the oracle trained on the pretraining's sequences: ``controls.oracle_steps_scale`` (default 1)
    x the pretraining's. The equal-token oracle keeps the pretraining's steps and tokens."""
    return round(plan["train"]["max_steps"] * plan.get("controls", {}).get("oracle_steps_scale", 1))


def plan_problem(plan: dict, kinds) -> "str | None":
    """What is wrong with the plan's extension, schemes, controls, sweep and retrieval sections (None: nothing)."""
    steps = plan["extension"]["curve_steps"]
    if len(steps) < 3 or steps[0] != 0 or sorted(set(steps)) != steps:  # the plateau compares the last two
        return (
            f"extension.curve_steps={steps} is invalid: expected increasing steps from 0, at least two after it, "
            "e.g. [0, 10, 25, 50, 100, 200]"
        )
    ext = plan["extension"]
    if not isinstance(ext.get("text_only", False), bool):
        return f"extension.text_only={ext['text_only']!r} is invalid: expected true or false"
    trials = ext.get("passkey_trials", 0)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 0:
        return f"extension.passkey_trials={trials!r} is invalid: expected an integer >= 0 (0: no passkey)"
    sourceless = [
        e
        for e in plan.get("controls", {}).get("other_extensions", [])
        if OTHER_EXTENSIONS.get(e, ("",))[0] not in kinds
    ]
    if sourceless:
        return (
            f"controls.other_extensions has {sourceless}, whose source kind the plan does not train: kinds are "
            f"{', '.join(kinds)}"
        )
    unknown = [m for m in plan["extension"]["methods"] if m not in METHOD_NAMES]
    if unknown:
        return f"extension.methods has {unknown}: valid: {', '.join(METHOD_NAMES)}"
    odd = {
        kind: sorted(set(tweaks) - {"position", "model", "train"})
        for kind, tweaks in plan["schemes"].items()
        if kind not in kinds or not isinstance(tweaks, dict) or set(tweaks) - {"position", "model", "train"}
    }
    if odd:
        return f"schemes has {odd}: keys are kinds ({', '.join(kinds)}) holding position, model and train settings"
    controls = plan.get("controls", {})
    bad = [k for k in controls.get("oracle", []) if k not in kinds] + [
        k for k in controls.get("other_extensions", []) if k not in OTHER_EXTENSIONS
    ]
    if bad:
        return (
            f"controls has {bad}: oracle takes kinds ({', '.join(kinds)}), other_extensions takes "
            f"{', '.join(OTHER_EXTENSIONS)}"
        )
    scale = controls.get("oracle_steps_scale", 1)
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not 0 < scale < math.inf
        or oracle_steps(plan) < 1
    ):
        return (
            f"controls.oracle_steps_scale={scale!r} is invalid: expected a finite number > 0 that leaves the "
            f"oracle at least one step (2: twice the pretraining's {plan['train']['max_steps']})"
        )
    s = plan.get("sweep", {"lrs": []})
    if any(not lr > 0 for lr in s["lrs"]) or (s["lrs"] and not plan["data"]["holdout_tokens"]):
        return f"sweep={s} is invalid: expected rates > 0, chosen on data.holdout_tokens > 0 of held-out training text"
    if s["lrs"] and not plan.get("tuning", {}).get("lr_scales"):
        return (
            "sweep.lrs needs the tuning section (tuning.seeds, tuning.lr_scales): the sweep fine-tunes "
            "the tuning seeds' models"
        )
    r = plan["retrieval"]
    if not r["depths"] or any(not 0 <= d <= 1 for d in r["depths"]) or r["trials"] < 1:
        return (
            f"retrieval.depths={r['depths']}, retrieval.trials={r['trials']} are invalid: expected depths from 0 "
            f"to 1 and at least one trial"
        )
    return None
