"""The engine's log lines through Python's logging, when the caller asks (log_to_python)."""

from __future__ import annotations

import logging
from typing import Optional

from gpubox import _core

_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)
_logger: Optional[logging.Logger] = None


def log_to_python(logger: Optional[logging.Logger] = None, enabled: bool = True) -> None:
    """Sends the engine's log lines (what the binaries write to stderr) to ``logger``
    (default: ``logging.getLogger("gpubox")``) instead of stderr; ``enabled=False`` restores
    stderr. Lines arrive at pass boundaries and when a call returns (the engine's threads never
    wait for the GIL); each record's message is the text after the ``file:line]`` prefix, the
    whole line is in ``record.gpubox_line``. GPUBOX_LOG_LEVEL still sets what the engine logs."""
    global _logger
    _logger = (logger or logging.getLogger("gpubox")) if enabled else None
    _core.capture_logs(enabled)
    if not enabled:
        flush()


def flush() -> None:
    """Hands the queued engine lines to the logger (nothing when not capturing)."""
    lines = _core.drain_logs()
    if _logger is None:
        return
    for level, line in lines:
        message = line.split("] ", 1)[1] if "] " in line else line
        _logger.log(_LEVELS[level], "%s", message, extra={"gpubox_line": line})
