"""What a pipeline stage holds in memory per device: the one formula every planner and bound uses.

A stage of l decoder layers, with C sequences in flight through its replica and micro-batches of b
sequences, holds per device (each member of a tensor-parallel group its share)

    l * (W + C * KV)  +  fixed  +  workspace(b)

with W one layer's weights, KV one layer's KV cache of one sequence at full context, `fixed` the
embedding's and head's weights where the stage holds them, and workspace(b) the largest task
workspace at b sequences. Every sequence in flight holds its KV cache on every stage at once,
whichever micro-batch it is in, so C multiplies KV, not b.
"""

from __future__ import annotations


def layer_bytes(weight_bytes: float, kv_bytes_per_seq: float, concurrency: float) -> float:
    """One decoder layer's bytes per device with `concurrency` sequences in flight: W + C * KV."""
    return weight_bytes + concurrency * kv_bytes_per_seq


def stage_bytes(
    *,
    layers: float,
    weight_bytes: float,
    kv_bytes_per_seq: float,
    concurrency: float,
    fixed_bytes: float = 0.0,
    workspace_bytes: float = 0.0,
) -> float:
    """A stage's bytes per device (module docstring)."""
    return layers * layer_bytes(weight_bytes, kv_bytes_per_seq, concurrency) + fixed_bytes + workspace_bytes


def concurrency_held(room_bytes: float, layers: float, weight_bytes: float, kv_bytes_per_seq: float) -> float:
    """The most sequences in flight (a real number) whose KV cache `layers` layers hold beside their
    weights in `room_bytes`: (room - l W) / (l KV); negative when the weights alone do not fit, inf
    when nothing grows with C."""
    free = room_bytes - layers * weight_bytes
    if kv_bytes_per_seq <= 0:
        return float("inf") if free >= 0 else float("-inf")
    return free / (layers * kv_bytes_per_seq)
