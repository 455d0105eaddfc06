"""Position-encoding registry. Each scheme lives in its own module and registers itself
with ``@register(name)``; importing this package imports every module in it, so adding a
scheme needs no edit anywhere else."""

import importlib
import pkgutil

from minilm.positions.base import (
    PositionError,
    PositionScheme,
    available,
    build,
    canonical,
    describe,
    register,
    scheme_class,
    unwrap_setting,
    validate,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "__main__") and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "PositionError",
    "PositionScheme",
    "available",
    "build",
    "canonical",
    "describe",
    "register",
    "scheme_class",
    "unwrap_setting",
    "validate",
]
