"""Collect KVP training data: per layer and KV head, the K/V of context tokens and the future
attention each receives, written as safetensors shards under a disk cap.

One sequence = context + future (see :mod:`research.kvp.texts`). The model runs once over the
whole sequence with a probe attention (exact causal softmax attention, fp32) that records, per
layer: the context's keys (RoPE applied, as the cache holds them) and values, and the attention
each context token receives from the future queries, averaged over those queries and over the
query heads of its KV head's group (the attention mass a KV head's token carries).

Shard layout: tensors ``{i:05d}.keys`` / ``.values`` (L, H_kv, C, D) float16 and
``{i:05d}.attention`` (L, H_kv, C) float32 per sequence i; metadata ``format``, ``model_fingerprint``,
``sequences`` (JSON: source, rows, context and future token counts).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AttentionInterface

from arbor_runtime.policies.kvp_weights import model_fingerprint
from research.kvp.texts import TrainingText

log = logging.getLogger(__name__)
SHARD_FORMAT = "arborkv-kvp-data/1"
PROBE = "arbor_kvp_probe"


@dataclass(slots=True)
class Probe:
    """What the probe attention records for one forward: the first ``context`` tokens are scored."""

    context: int
    keys: list[torch.Tensor] = field(default_factory=list)  # per layer (H_kv, C, D)
    values: list[torch.Tensor] = field(default_factory=list)
    attention: list[torch.Tensor] = field(default_factory=list)  # per layer (H_kv, C)


_ACTIVE: ContextVar[Probe | None] = ContextVar("kvp_probe", default=None)


def _probe_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """transformers attention interface: exact causal attention over one sequence, recorded.

    query (1, Hq, T, D); key, value (1, H_kv, T, D). Returns (1, T, Hq, D) and no weights.
    """
    probe = _ACTIVE.get()
    if probe is None:
        raise RuntimeError("the KVP probe attention ran outside probe_attention()")
    hq, t, h_kv = query.shape[1], query.shape[2], key.shape[1]
    group = hq // h_kv
    k, v = key[0].float().repeat_interleave(group, 0), value[0].float().repeat_interleave(group, 0)
    logits = torch.matmul(query[0].float(), k.transpose(-1, -2)) * (scaling or query.shape[-1] ** -0.5)
    logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool, device=query.device).triu(1), float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (Hq, T, T)
    c = probe.context
    probe.keys.append(key[0, :, :c].detach().cpu())
    probe.values.append(value[0, :, :c].detach().cpu())
    future = probs[:, c:, :c].reshape(h_kv, group, t - c, c).mean(dim=(1, 2))
    probe.attention.append(future.cpu())
    out = torch.matmul(probs, v).to(query.dtype)  # (Hq, T, D)
    return out.transpose(0, 1).unsqueeze(0).contiguous(), None


AttentionInterface.register(PROBE, _probe_attention)


@contextmanager
def probe_attention(model: torch.nn.Module, probe: Probe) -> Iterator[None]:
    """Route ``model``'s attention through the probe while the block runs (restored in ``finally``)."""
    previous = model.config._attn_implementation
    token = _ACTIVE.set(probe)
    model.config._attn_implementation = PROBE
    try:
        yield
    finally:
        model.config._attn_implementation = previous
        _ACTIVE.reset(token)


@torch.no_grad()
def future_attention(model: torch.nn.Module, ids: list[int], context: int) -> Probe:
    """Run ``ids`` once; the probe holds K/V (L x (H_kv, C, D)) of the first ``context`` tokens
    and the attention they receive from the rest, per layer (H_kv, C)."""
    if not 0 < context < len(ids):
        raise ValueError(f"context={context} must leave at least one future token of {len(ids)}")
    probe = Probe(context)
    device = next(model.parameters()).device
    with probe_attention(model, probe):
        model(input_ids=torch.tensor([ids], device=device), logits_to_keep=1, use_cache=False)
    return probe


def record_tensors(probe: Probe, index: int) -> dict[str, torch.Tensor]:
    """A probe's tensors under the shard names of sequence ``index``."""
    return {
        f"{index:05d}.keys": torch.stack(probe.keys).half(),
        f"{index:05d}.values": torch.stack(probe.values).half(),
        f"{index:05d}.attention": torch.stack(probe.attention).float(),
    }


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass(slots=True)
class ShardWriter:
    """Sequences into numbered shards of about ``shard_bytes``; refuses data past ``max_bytes``."""

    out: Path
    fingerprint: str
    max_bytes: int
    shard_bytes: int = 256 << 20
    written: int = 0
    shards: list[Path] = field(default_factory=list)
    _pending: dict[str, torch.Tensor] = field(default_factory=dict)
    _meta: list[dict] = field(default_factory=list)

    def fits(self, tensors: dict[str, torch.Tensor]) -> bool:
        return self.written + _nbytes(self._pending) + _nbytes(tensors) <= self.max_bytes

    def add(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        self._pending.update(tensors)
        self._meta.append(meta)
        if _nbytes(self._pending) >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        path = self.out / f"shard-{len(self.shards):04d}.safetensors"
        meta = {"format": SHARD_FORMAT, "model_fingerprint": self.fingerprint, "sequences": json.dumps(self._meta)}
        save_file(self._pending, str(path), metadata=meta)
        self.written += _nbytes(self._pending)
        self.shards.append(path)
        self._pending, self._meta = {}, []


def collect(
    loaded, texts: list[TrainingText], out: Path, max_bytes: int, on_sequence: Callable[[int, int], None] | None = None
) -> dict:
    """Run the model over ``texts`` and write shards to ``out``; stops early at ``max_bytes``.

    ``on_sequence(done, tokens)`` is called after each sequence (progress). Returns a summary
    (sequences, tokens, shards, bytes, whether the cap stopped it).
    """
    out.mkdir(parents=True, exist_ok=True)
    tok = loaded.tokenizer
    writer = ShardWriter(out, model_fingerprint(loaded.model), max_bytes)
    done, capped, tokens = 0, False, 0
    for i, text in enumerate(texts):
        ctx = list(tok(text.context, add_special_tokens=True)["input_ids"])
        fut = list(tok(text.future, add_special_tokens=False)["input_ids"])
        tensors = record_tensors(future_attention(loaded.model, ctx + fut, len(ctx)), i)
        if not writer.fits(tensors):
            capped = True
            log.warning("disk cap of %d bytes reached after %d sequences", max_bytes, done)
            break
        meta = {"index": i, "source": text.source, "rows": list(text.rows), "context": len(ctx), "future": len(fut)}
        writer.add(tensors, meta)
        done, tokens = done + 1, tokens + len(ctx) + len(fut)
        if on_sequence is not None:
            on_sequence(done, len(ctx) + len(fut))
    writer.flush()
    return {
        "sequences": done,
        "tokens": tokens,
        "shards": [str(p) for p in writer.shards],
        "bytes": writer.written,
        "capped": capped,
    }


@dataclass(frozen=True, slots=True)
class Sequence:
    """One collected sequence: keys, values (L, H_kv, C, D) float16; attention (L, H_kv, C) float32."""

    keys: torch.Tensor
    values: torch.Tensor
    attention: torch.Tensor
    source: str


def read_shards(folder: Path, fingerprint: str | None = None) -> list[Sequence]:
    """Every sequence in ``folder``'s shards, in index order; with ``fingerprint``, refuse data of another model."""
    paths = sorted(Path(folder).glob("shard-*.safetensors"))
    if not paths:
        raise FileNotFoundError(f"{folder} has no shard-*.safetensors files (run scripts/kvp_collect.py)")
    seqs = []
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != SHARD_FORMAT:
                raise ValueError(f"{path} is not a KVP data shard (format {meta.get('format')!r})")
            if fingerprint is not None and meta["model_fingerprint"] != fingerprint:
                raise ValueError(
                    f"{path} was collected with model fingerprint {meta['model_fingerprint']}, not {fingerprint}"
                )
            for m in json.loads(meta["sequences"]):
                key = f"{m['index']:05d}"
                seqs.append(
                    Sequence(
                        f.get_tensor(f"{key}.keys"),
                        f.get_tensor(f"{key}.values"),
                        f.get_tensor(f"{key}.attention"),
                        m["source"],
                    )
                )
    return seqs


def shard_fingerprint(folder: Path) -> str:
    """The model fingerprint recorded in ``folder``'s first shard."""
    path = min(Path(folder).glob("shard-*.safetensors"), default=None)
    if path is None:
        raise FileNotFoundError(f"{folder} has no shard-*.safetensors files (run scripts/kvp_collect.py)")
    with safe_open(str(path), framework="pt") as f:
        return (f.metadata() or {})["model_fingerprint"]
