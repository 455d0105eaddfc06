"""``python -m minilm positions``: inspect the position schemes of the registry.

usage:
  python -m minilm positions list
  python -m minilm positions plot KIND [model.position.KEY=VALUE ...] [--d-model N] [--n-head N] [--block-size N]
      --out FILE.png
  python -m minilm positions plot [KIND] --checkpoint OUT_DIR_OR_CKPT [model.position.KEY=VALUE ...] --out FILE.png
  python -m minilm positions layers [CONFIG] [key=value ...] [--out FILE.png] [--length N]

``list`` prints every registered kind with its description and options (defaults).
``plot`` draws the figure suited to a kind (the figures: minilm/figures/positions.py). Its settings are
written as everywhere else, ``model.position.KEY=VALUE`` with the kind's options from the registry (values
parsed as YAML, nested ones with dots), on top of the kind's defaults; ``model.d_model=N``, ``model.n_head=N``
and ``model.block_size=N`` set the shape as --d-model, --n-head and --block-size do:
  plot rope model.position.scaling.type=yarn model.position.scaling.factor=4 --out rope_yarn.png
  plot interpolated model.position.inner.kind=alibi model.position.factor=2 --out alibi_pi.png
(the old ``--scaling.type yarn`` still works for one release, with a note naming the new spelling).
With --checkpoint the kind, options and model shape come from the checkpoint and the figure shows
its trained values (a KIND that disagrees is an error); settings change it as they do at evaluation.
``layers`` prints a config's layer design (model.layers; default config rope.yaml) as a table, one row
per layer: its type, position, window, chunk, learned sinks, soft-cap and query scale. With --out it
draws one panel per layer type: the keys each query sees over N positions (--length, default 3 x the
largest window or chunk, else 32), as the model's attention mask computes them (minilm/figures/layers.py):
  layers rnope_swa.yaml --out layers.png
  layers 'model.layers={pattern: [local, global], local: {window: 8}, global: {}}' --out mine.png
"""

from __future__ import annotations

import copy
import shlex
import sys

import torch
import yaml

from minilm.checkpoints.loading import load_model
from minilm.cli import is_setting, note_old, run_command, written
from minilm.common import MinilmError, markdown_table, output_path, suggest
from minilm.config import ModelConfig
from minilm.configfile import apply_overrides, load_config
from minilm.figures import positions as plots
from minilm.figures.canvas import check_figure_path, require_matplotlib
from minilm.figures.layers import plot_layers, query_scale_text
from minilm.positions import available, build, canonical, describe, scheme_class
from minilm.positions.layers import describe_design, layer_types

SHAPE = {"d-model": "d_model", "n-head": "n_head", "block-size": "block_size"}
MAX_SHAPE = {"d-model": 16384, "n-head": 1024, "block-size": 16384}  # what a figure can draw in memory
PLOT_SETTINGS = ("model.position", *(f"model.{name}" for name in SHAPE.values()))  # what a plot's settings change
DEFAULT_SHAPE = {name: getattr(ModelConfig(), name) for name in SHAPE.values()}  # the model's own defaults
LENGTH = (2, 4096)  # the positions a layers figure may draw: every one against every other
UNSET = "\u2014"  # a table cell for a setting a layer type leaves unset


class UsageError(MinilmError):
    """A command line the positions verb cannot take: said in one line, exit status 2."""


def format_options(options: dict) -> str:
    """``name=default`` pairs, values written as YAML (as they are given on the command line)."""
    if not options:
        return "(no options)"

    def value(v):
        return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()

    return "  ".join(f"{k}={value(v)}" for k, v in options.items())


def list_schemes() -> str:
    """One line per registered kind (description), then its options with their defaults."""
    kinds = available()
    width = max(len(k) for k in kinds)
    lines = []
    for kind in kinds:
        cls = scheme_class(kind)
        lines.append(f"{kind:<{width}}  {cls.description}")
        lines.append(f"{'':<{width}}    options: {format_options(cls.options)}")
    lines.append(
        "set options as model.position.NAME=VALUE (nested: model.position.scaling.type=yarn), e.g. minilm "
        "positions plot rope model.position.scaling.type=yarn model.position.scaling.factor=4 --out rope.png"
    )
    return "\n".join(lines)


def parse_plot_args(argv) -> dict:
    """Split ``plot`` arguments into kind, --out, --checkpoint, model shape (--d-model, ...) and settings
    (``model.position.KEY=VALUE``, ``model.d_model=N``, ...; the old ``--KEY VALUE`` for a position option
    is one too, with a note naming its new spelling)."""
    parsed = {"kind": None, "out": None, "checkpoint": None, "shape": {}, "settings": []}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            if is_setting(token):
                parsed["settings"].append(token)
            elif "=" in token:
                raise UsageError(f"{token!r} is no setting: a figure's settings are written model.position.KEY=VALUE")
            elif parsed["kind"] is not None:
                raise UsageError(
                    f"unexpected argument {token!r}: give one KIND, and settings as model.position.KEY=VALUE"
                )
            else:
                parsed["kind"] = token
            i += 1
            continue
        name, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UsageError(f"--{name} needs a value (--{name} VALUE or --{name}=VALUE)")
            value = argv[i + 1]
            i += 1
        i += 1
        if name in ("out", "checkpoint"):
            parsed[name] = value
        elif name in SHAPE:
            parsed["shape"][SHAPE[name]] = shape_number(f"--{name}", value)
        elif name == "kind" or name == "":
            raise UsageError(f"give the position kind as the first argument (valid: {', '.join(available())})")
        else:
            parsed["settings"].append(f"model.position.{name.replace('-', '_')}={value}")
            note_old(f"--{name} {shlex.quote(value)}", written(parsed["settings"][-1]))
    if parsed["out"] is None:
        raise UsageError("plot needs --out FILE.png")
    return parsed


def shape_number(option: str, value):
    """A model shape for a figure (``--d-model 64``, ``model.d_model=64``): an integer within MAX_SHAPE."""
    name = option.removeprefix("model.").removeprefix("--").replace("_", "-")
    number = _yaml(option, value) if option.startswith("--") else value
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= MAX_SHAPE[name]:
        raise UsageError(
            f"{option}={value!r} is invalid: expected an integer from 1 to {MAX_SHAPE[name]:,} "
            f"(a figure draws every position against every other)"
        )
    return number


def _yaml(name, value):
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        raise UsageError(f"{name}={value!r} is not a valid value") from None


def plot_settings(kind: str, settings) -> tuple:
    """(the position setting, the model shape it sets) of a ``plot``: the registry's defaults for ``kind``
    with ``model.position.KEY=VALUE`` settings on top (a new ``model.position.kind`` starts from its own
    defaults), and ``model.d_model`` / ``n_head`` / ``block_size``. Any other key is refused in one line."""
    cls = scheme_class(kind)
    tree = {"model": {"position": {"kind": kind, **copy.deepcopy(cls.options)}}}
    apply_overrides(
        tree, [_current_name(cls, s) for s in settings], allowed=PLOT_SETTINGS, what="in a figure of a scheme"
    )
    model = tree["model"]
    position = model.pop("position")
    for name in model:
        if name not in SHAPE.values():
            raise UsageError(f"model.{name} is no setting of a figure: {suggest(name, ['position', *SHAPE.values()])}")
    if not isinstance(position, dict):
        raise UsageError(f"model.position={position!r} is invalid: expected a mapping of the scheme's options")
    kind = position.get("kind", kind)
    position = canonical({"kind": kind, **copy.deepcopy(scheme_class(kind).options), **position})
    return position, {name: shape_number(f"model.{name}", value) for name, value in model.items()}


def _current_name(cls, setting: str) -> str:
    """``model.position.NAME...=VALUE`` with NAME under the option's current name (--base.kind is --inner.kind):
    renamed before the defaults are merged, where ``canonical`` would see both names."""
    prefix = "model.position."
    if not setting.startswith(prefix):
        return setting
    key, eq, value = setting[len(prefix) :].partition("=")
    head, dot, rest = key.partition(".")
    return prefix + cls.renamed_options.get(head, head) + dot + rest + eq + value


def plot(argv) -> str:
    args = parse_plot_args(argv)
    require_matplotlib()  # fail early, before any model is loaded, when matplotlib is missing
    check_figure_path(args["out"])  # and the image format: before an earlier file is set aside
    kind, source = args["kind"], args["checkpoint"]
    if source is not None:
        if args["shape"]:
            given = " ".join(f"--{k.replace('_', '-')}" for k in args["shape"])
            raise UsageError(f"with --checkpoint the model shape comes from the checkpoint: drop {given}")
        model, _tokenizer, config, _state = load_model(source, args["settings"])
        position = config.model.position
        if kind is not None and kind != position["kind"]:
            raise UsageError(
                f"checkpoint {source!r} has position kind {position['kind']!r}, not {kind!r}: "
                f"omit KIND or give {position['kind']}"
            )
        scheme = model.positions
        own = sorted({t.name for t in model.layer_types if t.position != position})
        if own:  # the figure draws model.position: layers of these types have positions of their own
            print(
                f"note: the figure draws model.position ({position['kind']}); the model's layers of type "
                f"{', '.join(own)} have positions of their own: "
                f"{describe_design(position, config.model.layers, config.model.n_layer)}",
                file=sys.stderr,
            )
    else:
        if kind is None:
            raise UsageError(f"give a position kind (valid: {', '.join(available())}) or --checkpoint")
        position, shape = plot_settings(kind, args["settings"])
        shape = {**DEFAULT_SHAPE, **args["shape"], **shape}
        if shape["d_model"] % shape["n_head"]:
            raise UsageError(f"d_model={shape['d_model']} is not divisible by n_head={shape['n_head']}")
        with torch.random.fork_rng():  # learned values start from seed 0: the same figure every time
            torch.manual_seed(0)
            scheme = build(position, **shape).eval()  # as at evaluation: no dropout of any kind
    path = plots.plot_scheme(scheme, position, output_path(args["out"]), source=source)  # an earlier file: set aside
    return f"wrote {path}: {plots.settings_line(position)}" + (f" (from {source})" if source else "")


def parse_layers_args(argv) -> dict:
    """Split ``layers`` arguments into the config file, its ``key=value`` overrides, --out and --length."""
    parsed = {"config": None, "overrides": [], "out": None, "length": None}
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            if "=" in token:
                parsed["overrides"].append(token)
            elif parsed["config"] is None:
                parsed["config"] = token
            else:
                raise UsageError(f"unexpected argument {token!r}: give one CONFIG, then key=value overrides")
            continue
        name, eq, value = token[2:].partition("=")
        if name not in ("out", "length"):
            raise UsageError(f"unknown option --{name} for layers: valid: --out FILE.png, --length N")
        if not eq:
            if i >= len(argv) or argv[i].startswith("--"):
                raise UsageError(f"--{name} needs a value (--{name} VALUE or --{name}=VALUE)")
            value, i = argv[i], i + 1
        parsed[name] = value
    if parsed["length"] is not None:
        number = _yaml("--length", parsed["length"])
        if not isinstance(number, int) or isinstance(number, bool) or not LENGTH[0] <= number <= LENGTH[1]:
            raise UsageError(
                f"--length={parsed['length']!r} is invalid: expected an integer from {LENGTH[0]} to {LENGTH[1]:,} "
                f"(the figure draws every position against every other)"
            )
        if parsed["out"] is None:
            raise UsageError("--length sets the positions of the figure: give --out FILE.png too")
        parsed["length"] = number
    return parsed


def layer_rows(types: list, uniform: bool) -> list:
    """The rows of the layer design table: one per layer, or, when every layer is ``model.position``
    (``uniform``: no model.layers), one row for them all."""

    def cells(t):
        return (
            t.name,
            describe(t.position),
            UNSET if t.window is None else t.window,
            UNSET if t.chunk is None else t.chunk,
            "yes" if t.sinks else UNSET,
            f"{t.softcap:g}" if t.softcap else UNSET,
            UNSET if t.query_scale is None else query_scale_text(t.query_scale),
        )

    if uniform:
        return [(f"0-{len(types) - 1}" if len(types) > 1 else "0", "all (model.position)", *cells(types[0])[1:])]
    return [(index, *cells(t)) for index, t in enumerate(types)]


def default_length(types: list) -> int:
    """3 x the largest window or chunk of the layer types (at most LENGTH's top), else 32."""
    spans = [s for t in types for s in (t.window, t.chunk) if s is not None]
    return min(LENGTH[1], 3 * max(spans)) if spans else 32


def layers(argv) -> str:
    """The config's layer design as a markdown table, and with --out its figure."""
    args = parse_layers_args(argv)
    if args["out"] is not None:
        check_figure_path(args["out"])  # matplotlib and the image format, before any work
    name = args["config"] or "rope.yaml"
    model = load_config(name, args["overrides"]).model
    types = layer_types(model.layers, model.position, model.n_layer)
    if model.layers is None:
        head = f"{name}: {model.n_layer} layers; model.layers unset: every layer is model.position"
    else:
        head = f"{name}: {model.n_layer} layers, model.layers.pattern [{', '.join(model.layers['pattern'])}] repeated"
    table = markdown_table(
        ("layer", "type", "position", "window", "chunk", "learned sinks", "softcap", "query scale"),
        layer_rows(types, uniform=model.layers is None),
        align="lllrrlrl",
    )
    lines = [head, table]
    if args["out"] is not None:
        length = args["length"] or default_length(types)
        drawn = plot_layers(types, output_path(args["out"]), length=length, source=name)  # an earlier file: set aside
        lines.append(f"wrote {drawn.path}: the keys each query sees over {length} positions, one panel per layer type")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and (argv[0] in ("-h", "--help") or "--help" in argv or "-h" in argv):
        print(__doc__.strip())
        return 0
    if not argv:
        print("error: give a command: list, plot or layers (see python -m minilm positions --help)", file=sys.stderr)
        return 2
    return run_command(lambda: _run(argv[0], argv[1:]))


def _run(command: str, rest: list) -> int:
    if command == "list":
        if rest:
            raise UsageError(f"list takes no arguments, got {' '.join(rest)}")
        print(list_schemes())
    elif command == "plot":
        print(plot(rest))
    elif command == "layers":
        print(layers(rest))
    else:
        raise UsageError(f"unknown command {command!r}: valid: list, plot, layers")
    return 0
