"""KV store: per-block tensors on the device tier, accounting, path gathering."""

from arbor_runtime.kv.block import BlockKV, Segment
from arbor_runtime.kv.pool import DevicePool, Extent, PoolExhausted
from arbor_runtime.kv.shape import KVShape
from arbor_runtime.kv.store import KVStore

__all__ = ["BlockKV", "DevicePool", "Extent", "KVShape", "KVStore", "PoolExhausted", "Segment"]
