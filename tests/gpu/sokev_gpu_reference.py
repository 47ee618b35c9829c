"""NumPy references shared by the GPU tests (imports nothing GPU-specific)."""
import os

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _skip_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    lib = os.environ.get("SOKEV_GPU_LIB",
                         os.path.join(_ROOT, "cc", "gpu_harness", "build", "libsokev_gpu.so"))
    if not os.path.exists(lib):
        return "libsokev_gpu.so not built (cc/gpu_harness/build.sh)"
    return None


# Why the GPU tests skip here, or None where they can run.
SKIP_REASON = _skip_reason()

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x):
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xbf58476d1ce4e5b9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94d049bb133111eb)
        x = x ^ (x >> np.uint64(31))
    return x


def key_bits(keys):
    return np.asarray(keys).astype(np.int64).view(np.uint64)


def counter_uniform(seed, keys, column, draw=0):
    with np.errstate(over="ignore"):
        inner = mix64(
            np.uint64(column) * np.uint64(0x100000001b3) +
            np.uint64(draw) * np.uint64(0x9e3779b97f4a7c15))
        x = mix64(np.uint64(seed) ^ mix64(key_bits(keys) ^ inner))
    return (x >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def uniform_rows(seed, a, b, keys, dim):
    """initial_row() of kRandomUniform, float32 like the C++."""
    cols = [
        np.float32(a) + (np.float32(b) - np.float32(a)) * counter_uniform(seed, keys, c)
        for c in range(dim)
    ]
    return np.stack(cols, axis=1).astype(np.float32)


def owner_of(keys, workers):
    return (mix64(key_bits(keys) ^ np.uint64(0x5bd1e9955bd1e995)) % np.uint64(workers)).astype(
        np.int64)


def zipf_keys(rng, n, vocab, alpha=1.1, dtype=np.int64, signed=True):
    ranks = rng.zipf(alpha, n) % vocab
    perm_salt = rng.integers(1, 1 << 30)
    keys = (ranks * 2654435761 + perm_salt) % vocab
    if signed:
        keys = keys - vocab // 2
    return keys.astype(dtype)


def combine_reference(values, index, weights, offsets, combiner):
    """float64 tf.nn.embedding_lookup_sparse arithmetic."""
    batch = len(offsets) - 1
    out = np.zeros((batch, values.shape[1]))
    for b in range(batch):
        s, e = offsets[b], offsets[b + 1]
        if s == e:
            continue
        w = np.ones(e - s) if weights is None else weights[s:e].astype(np.float64)
        acc = (w[:, None] * values[index[s:e]].astype(np.float64)).sum(0)
        if combiner == "mean":
            acc /= w.sum()
        elif combiner == "sqrtn":
            acc /= np.sqrt((w * w).sum())
        out[b] = acc
    return out


def combine_backward_reference(grad_out, index, weights, offsets, combiner, num_unique):
    grad = np.zeros((num_unique, grad_out.shape[1]))
    for b in range(len(offsets) - 1):
        s, e = offsets[b], offsets[b + 1]
        if s == e:
            continue
        w = np.ones(e - s) if weights is None else weights[s:e].astype(np.float64)
        scale = 1.0
        if combiner == "mean":
            scale = 1.0 / w.sum()
        elif combiner == "sqrtn":
            scale = 1.0 / np.sqrt((w * w).sum())
        np.add.at(grad, index[s:e], (w * scale)[:, None] * grad_out[b][None, :])
    return grad


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert np.all(np.isfinite(out)), "non-finite output (unwritten or NaN)"
    denom = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0)


# Optimizer hyperparameters of the GPU tests: every field non-default, so a
# field read from the wrong place shows.
OPTIMIZER_HYPERPARAMETERS = dict(lr=0.05,
                                 beta1=0.9,
                                 beta2=0.999,
                                 epsilon=1e-7,
                                 beta1_power=0.9**3,
                                 beta2_power=0.999**3,
                                 momentum=0.8,
                                 l1=0.01,
                                 l2=0.02,
                                 l2_shrinkage=0.01,
                                 lr_power=-0.5,
                                 decay=0.9)
