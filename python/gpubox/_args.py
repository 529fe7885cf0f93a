"""Checks of the Python API's own arguments, made before the engine starts (a wrong type found
only when the engine first used it failed a run after its first pass had trained and saved)."""

from __future__ import annotations

from typing import Any

# gpubox_train's --threads_per_card range (trainer/main/gpubox_train.cpp).
_MAX_THREADS = 4096


def callback(name: str, value: Any) -> None:
    """``value`` is None or callable; else TypeError naming ``name``."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a callable or None, got {type(value).__name__} "
                        f"{value!r}")


def threads(name: str, value: Any) -> None:
    """``value`` is a whole number in [0, 4096] (0: the cores shared by the cards); else
    ValueError (TypeError for another type) naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number in [0, {_MAX_THREADS}] (0: the machine's "
                        f"cores), got {type(value).__name__} {value!r}")
    if not 0 <= value <= _MAX_THREADS:
        raise ValueError(f"{name} must be in [0, {_MAX_THREADS}] (0: the machine's cores), "
                         f"got {value}")
