"""Interventions during training (placeholder-free stub: none configured -> None).

The full implementation lands with the interventions issue; until then a config with an
[intervene] table is refused up front rather than silently ignored.
"""

from __future__ import annotations

from dynamics.config import ConfigError, RunConfig


def check(cfg: RunConfig) -> None:
    """Validate cfg.intervene before any work (raises ConfigError naming the key)."""
    if cfg.intervene:
        raise ConfigError(f"intervene: unknown keys {sorted(cfg.intervene)} (interventions are not available yet)")


def build(cfg: RunConfig, model, device):
    """The run's interventions object, or None when the config asks for none."""
    check(cfg)
    return None
