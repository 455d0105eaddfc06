"""The extension arm of the length-generalization study: rope's scaling methods, the other
schemes' extensions by position interpolation, the keep-training control, their names in the
report, and the evaluation-time overrides that apply a method to its source zero-shot (step 0)."""
from __future__ import annotations

import yaml

METHOD_NAMES = {"none": "no scaling", "linear": "PI (linear)", "ntk": "NTK-aware", "dynamic": "dynamic NTK",
                "yarn": "YaRN", "llama3": "llama3"}
# extensions of the other schemes that have one (position interpolation of a table or of sin/cos),
# and the control that keeps training at L with the fine-tuning's tokens
OTHER_EXTENSIONS = {"learned-pi": ("learned", "learned + PI"), "sinusoidal-pi": ("sinusoidal", "sinusoidal + PI")}
CONTROL_NAMES = {"keep": "rope, training kept at L"}
LABEL_NAMES = {**METHOD_NAMES, **{k: name for k, (_, name) in OTHER_EXTENSIONS.items()}, **CONTROL_NAMES}


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
    interpolated for ``OTHER_EXTENSIONS``; nothing for no scaling and the keep-training control)."""
    if method in OTHER_EXTENSIONS:
        position = interpolated_position(method, factor)
        text = yaml.safe_dump(position, default_flow_style=True, sort_keys=False).strip()
        return [f"model.position={text}"] + ([] if "factor" in position else [f"model.block_size={length}"])
    return [] if method in ("none", "keep") else [f"model.position.scaling={{type: {method}, factor: {factor}}}"]


def extension_labels(plan: dict) -> list:
    """The rows of the extension's tables: the plan's methods, the other schemes' extensions and
    the keep-training control it runs."""
    controls = plan.get("controls", {})
    return [*plan["extension"]["methods"], *controls.get("other_extensions", []),
            *(["keep"] if controls.get("keep_training") else [])]


def plan_problem(plan: dict, kinds) -> "str | None":
    """What is wrong with the plan's extension, schemes, controls, sweep and retrieval sections (None: nothing)."""
    steps = plan["extension"]["curve_steps"]
    if not steps or steps[0] != 0 or sorted(set(steps)) != steps:
        return f"extension.curve_steps={steps} is invalid: expected increasing steps from 0, e.g. [0, 10, 25, 50, 100, 200]"
    unknown = [m for m in plan["extension"]["methods"] if m not in METHOD_NAMES]
    if unknown:
        return f"extension.methods has {unknown}: valid: {', '.join(METHOD_NAMES)}"
    odd = {kind: sorted(set(tweaks) - {"position", "model", "train"}) for kind, tweaks in plan["schemes"].items()
           if kind not in kinds or not isinstance(tweaks, dict) or set(tweaks) - {"position", "model", "train"}}
    if odd:
        return f"schemes has {odd}: keys are kinds ({', '.join(kinds)}) holding position, model and train settings"
    controls = plan.get("controls", {})
    bad = ([k for k in controls.get("oracle", []) if k not in kinds]
           + [k for k in controls.get("other_extensions", []) if k not in OTHER_EXTENSIONS])
    if bad:
        return (f"controls has {bad}: oracle takes kinds ({', '.join(kinds)}), other_extensions takes "
                f"{', '.join(OTHER_EXTENSIONS)}")
    s = plan.get("sweep", {"method": "linear", "lrs": []})
    if s["method"] not in METHOD_NAMES or any(not lr > 0 for lr in s["lrs"]) or (s["lrs"] and
                                                                              not plan["data"]["holdout_tokens"]):
        return (f"sweep={s} is invalid: expected a method ({', '.join(METHOD_NAMES)}) and rates > 0, chosen on "
                f"data.holdout_tokens > 0 of held-out training text")
    r = plan["retrieval"]
    if not r["depths"] or any(not 0 <= d <= 1 for d in r["depths"]) or r["trials"] < 1:
        return (f"retrieval.depths={r['depths']}, retrieval.trials={r['trials']} are invalid: expected depths from 0 "
                f"to 1 and at least one trial")
    return None
