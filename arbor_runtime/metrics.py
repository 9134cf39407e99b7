"""Run metrics: token counts, memory peaks, timings and a per-step memory trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class TracePoint:
    """Memory after one runtime operation (one search step).

    Attributes:
        step: running operation counter; op: "new_tree" | "expand" | "append" | "release".
        resident_tokens / resident_bytes: device KV after the operation (blocks only).
        peak_tokens: highest resident + working tokens seen during the operation.
        t: seconds since the runtime was created.
    """

    step: int
    op: str
    resident_tokens: int
    resident_bytes: int
    peak_tokens: int
    t: float


@dataclass(slots=True)
class RuntimeMetrics:
    """Counters a run records; ``to_dict`` gives a JSON-friendly summary (trace excluded).

    Token counts: ``prefill_tokens`` are tokens whose KV a prefill computed (prompts, forced
    blocks), ``decode_tokens`` those computed one step at a time (generated blocks). Each token of
    the tree is computed exactly once, so their sum equals the sum of block lengths.
    """

    prefill_tokens: int = 0
    decode_tokens: int = 0
    forward_calls: int = 0
    model_seconds: float = 0.0
    runtime_seconds: float = 0.0
    peak_device_tokens: int = 0
    peak_device_bytes: int = 0
    peak_working_bytes: int = 0
    nodes_created: int = 0
    nodes_released: int = 0
    trace: list[TracePoint] = field(default_factory=list)

    @property
    def overhead_seconds(self) -> float:
        """Time inside runtime calls but outside model forwards."""
        return max(0.0, self.runtime_seconds - self.model_seconds)

    def note_peak(self, tokens: int, bytes_per_token: int) -> None:
        if tokens > self.peak_device_tokens:
            self.peak_device_tokens = tokens
            self.peak_device_bytes = tokens * bytes_per_token

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "trace"}
        out["overhead_seconds"] = self.overhead_seconds
        return out
