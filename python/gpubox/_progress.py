"""The progress bar of :func:`gpubox.train`: one per pass, from the engine's step progress.

tqdm (``tqdm.auto``: a widget in a notebook) when importable, else one line on stderr redrawn
in place. Shown only where someone watches: stderr a terminal, or an IPython kernel (a
notebook); never in a pipe, a log file or a batch job unless asked for.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Optional, TextIO


@dataclass(frozen=True)
class StepProgress:
    """Where a pass stands after a step (card 0 of trainer 0): the engine's progress line."""

    pass_id: int
    #: Steps done (from 1) of the pass's ``steps``.
    step: int
    steps: int
    examples_per_second: float
    #: The pass's running AUC (NaN before both classes were seen).
    auc: float
    seconds: float

    @classmethod
    def _from(cls, d: dict[str, Any]) -> "StepProgress":
        return cls(d["pass"], d["step"], d["steps"], d["examples_per_second"], d["auc"],
                   d["seconds"])


def interactive(stream: Optional[TextIO] = None) -> bool:
    """Whether a person watches: ``stream`` (stderr) is a terminal, or this is a notebook."""
    stream = stream if stream is not None else sys.stderr
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # a replaced or closed stream
        pass
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None  # type: ignore[attr-defined]
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _tqdm() -> Any:
    try:
        from tqdm.auto import tqdm  # type: ignore[import-not-found]
    except ImportError:
        return None
    return tqdm


def _fixed(value: float, digits: int) -> str:
    return "nan" if math.isnan(value) else f"{value:.{digits}f}"


class ProgressBar:
    """A bar per pass: steps done of the pass's steps, examples/s and the running AUC."""

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._tqdm = _tqdm()
        self._bar: Any = None
        self._pass: Optional[int] = None

    def update(self, p: StepProgress) -> None:
        if p.pass_id != self._pass:
            self.close()
            self._pass = p.pass_id
            if self._tqdm is not None:
                self._bar = self._tqdm(total=p.steps, desc=f"pass {p.pass_id}", unit="step",
                                       leave=True, file=self._stream)
        if self._bar is not None:
            self._bar.update(p.step - self._bar.n)
            self._bar.set_postfix(auc=_fixed(p.auc, 4), ips=_fixed(p.examples_per_second, 0),
                                  refresh=False)
        else:
            percent = 100.0 * p.step / p.steps if p.steps else 100.0
            self._stream.write(f"\rpass {p.pass_id}: {p.step}/{p.steps} steps ({percent:.1f}%), "
                               f"{_fixed(p.examples_per_second, 1)} example/sec, "
                               f"auc: {_fixed(p.auc, 6)}\033[K")
            self._stream.flush()
        if p.step >= p.steps:
            self.close()

    def close(self) -> None:
        """Ends the current pass's bar (its last state stays on screen)."""
        if self._bar is not None:
            self._bar.close()
        elif self._pass is not None:
            self._stream.write("\n")
            self._stream.flush()
        self._bar = None
        self._pass = None
