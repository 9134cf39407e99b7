"""KV store: per-block tensors on the device tier, accounting, path gathering."""

from arbor_runtime.kv.block import BlockKV
from arbor_runtime.kv.store import KVShape, KVStore

__all__ = ["BlockKV", "KVShape", "KVStore"]
