"""dynamics: train small transformers from scratch and watch their attention heads specialise.

Public entry points are re-exported lazily, so ``import dynamics`` stays cheap and the
analysis side can be used without importing torch.
"""

import pkgutil
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "load_config": "dynamics.config",
    "RunConfig": "dynamics.config",
    "ConfigError": "dynamics.config",
    "open_run": "dynamics.store",
    "open_sweep": "dynamics.store",
    "recorded_snapshots": "dynamics.store",
    "open_analysis": "dynamics.store",
    "open_derived": "dynamics.store",
    "list_runs": "dynamics.store",
    "StaleAnalysisWarning": "dynamics.store",
    "check_recorded": "dynamics.store",
    "StoreError": "dynamics.store",  # what open_run, check_recorded and the other readers raise
}

__all__ = sorted(_EXPORTS) + ["__version__"]


_SUBMODULES = frozenset(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
"""Imported on first use as ``dynamics.<name>``: the README's ``dynamics.train.load_run_model``
after a plain ``import dynamics`` raised AttributeError, as a package's submodules are not
attributes until something imports them. Listed from the package folder, so a new module
needs no entry here."""


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return import_module(f"dynamics.{name}")
    raise AttributeError(f"module 'dynamics' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazy names too: a notebook's tab completion on `dynamics.` offered none of them
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)
