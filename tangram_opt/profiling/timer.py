"""Timing one layer's forward and backward pass on one device.

Method: ``warmup`` untimed forward + backward passes (kernel selection, allocator, autotuning), then
``repeats`` timed ones; the profile records the median of each pass. On CUDA the passes are timed
with CUDA events on the current stream and read after one ``synchronize`` at the end, so the
device's time is measured, not the host's (the host runs ahead, as in training); peak memory is
``torch.cuda.max_memory_allocated`` over the timed repeats. On the CPU the passes run synchronously
and are timed with ``time.perf_counter``.

Weight gradients are set to ``None`` before every repeat (untimed), so each backward writes them
rather than adding to earlier ones: the cost of a micro-batch under Megatron-LM's
gradient-accumulation fusion. PyTorch's own accumulation across micro-batches would add one pass
over the layer's weights per micro-batch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Timed forward and backward passes of one layer, in seconds, and CUDA memory in bytes."""

    fwd_times_s: tuple[float, ...]
    bwd_times_s: tuple[float, ...]
    #: ``torch.cuda.max_memory_allocated`` over the timed repeats (None on the CPU)
    peak_allocated_bytes: int | None = None
    #: allocated before a forward pass: weights, inputs and the output gradient (None on the CPU)
    base_allocated_bytes: int | None = None

    @property
    def fwd_time_s(self) -> float:
        return statistics.median(self.fwd_times_s)

    @property
    def bwd_time_s(self) -> float:
        return statistics.median(self.bwd_times_s)

    @property
    def peak_over_base_bytes(self) -> int | None:
        """Peak memory above the weights and inputs: activations, weight gradients, scratch."""
        if self.peak_allocated_bytes is None or self.base_allocated_bytes is None:
            return None
        return self.peak_allocated_bytes - self.base_allocated_bytes


def measure(forward: Callable[[], Any], backward: Callable[[Any], None], module: torch.nn.Module,
            device: torch.device, *, warmup: int, repeats: int,
            on_pass: Callable[[], None] | None = None, before_pass: Callable[[], None] | None = None) -> Measurement:
    """Time ``backward(forward())`` ``repeats`` times after ``warmup`` untimed runs.

    ``before_pass`` runs untimed before every pass (e.g. to drop an input's gradient); ``on_pass``
    after every pass (progress).
    """

    def reset() -> None:
        module.zero_grad(set_to_none=True)
        if before_pass is not None:
            before_pass()

    for _ in range(warmup):
        reset()
        backward(forward())
        if on_pass is not None:
            on_pass()
    if device.type == "cuda":
        return _measure_cuda(forward, backward, reset, device, repeats, on_pass)
    fwd, bwd = [], []
    for _ in range(repeats):
        reset()
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        backward(out)
        t2 = time.perf_counter()
        del out
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        if on_pass is not None:
            on_pass()
    return Measurement(fwd_times_s=tuple(fwd), bwd_times_s=tuple(bwd))


def _measure_cuda(forward: Callable[[], Any], backward: Callable[[Any], None], reset: Callable[[], None],
                  device: torch.device, repeats: int, on_pass: Callable[[], None] | None) -> Measurement:
    torch.cuda.synchronize(device)
    reset()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    events = []
    for i in range(repeats):
        if i:
            reset()
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        out = forward()
        e1.record()
        backward(out)
        e2.record()
        del out
        events.append((e0, e1, e2))
        if on_pass is not None:
            on_pass()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    fwd = tuple(e0.elapsed_time(e1) / 1e3 for e0, e1, _ in events)
    bwd = tuple(e1.elapsed_time(e2) / 1e3 for _, e1, e2 in events)
    return Measurement(fwd_times_s=fwd, bwd_times_s=bwd, peak_allocated_bytes=int(peak), base_allocated_bytes=int(base))
