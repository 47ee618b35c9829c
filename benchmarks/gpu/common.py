"""Timing helpers for the GPU benchmarks: CUDA events after warm-up, inputs
rotated so repeated runs do not measure the L2, medians with spread."""
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "cc", "gpu_harness"))


def time_ms(fn, inputs, warmup=3, reps=15):
    """fn(inputs[i % len(inputs)]) timed with CUDA events; returns
    (median, min, max) in ms."""
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times), max(times)


def copy_bandwidth():
    """Device-to-device copy bandwidth, bytes read + written per second."""
    n = 1 << 29  # 2 GiB of float32
    a = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    med, _, _ = time_ms(lambda _: b.copy_(a), [None], warmup=3, reps=10)
    del a, b
    return 2 * n * 4 / (med * 1e-3)


def fmt(t):
    return f"{t[0]:.3f} ms [{t[1]:.3f}, {t[2]:.3f}]"
