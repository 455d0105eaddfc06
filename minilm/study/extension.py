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
