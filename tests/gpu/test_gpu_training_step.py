"""The training step's fused stages vs the unfused ones they replace:
unique_segmented vs NumPy, the forward from resolved row ids vs find +
combine, and backward_apply (backward + optimizer in one kernel) vs
combine_backward + update_rows + apply_optimizer, bit for bit. Fresh random
inputs every run; outputs poisoned before each call."""
import numpy as np
import pytest

from sokev_gpu_reference import (OPTIMIZER_HYPERPARAMETERS, SKIP_REASON, combine_reference, rel_err,
                                 zipf_keys)

if SKIP_REASON is None:
    import torch
    import sokev_gpu as sg

RNG = np.random.default_rng()
HP = OPTIMIZER_HYPERPARAMETERS


def tensor(array):
    return torch.from_numpy(np.ascontiguousarray(array)).cuda()


def ragged(batch, max_hot):
    sizes = RNG.integers(0, max_hot + 1, batch)
    sizes[RNG.integers(0, batch, batch // 10)] = 0  # empty rows
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def batch_keys(dtype, nnz):
    np_dtype = np.int32 if dtype == "int32" else np.int64
    return zipf_keys(RNG, nnz, 1 << 16, dtype=np_dtype)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("n", [1, 1000, 300_000])
def test_unique_segmented(dtype, n):
    keys = batch_keys(dtype, n)
    uniq, inverse, order, segments, num = sg.unique_segmented(tensor(keys))
    u = int(num.item())
    uniq, inverse = uniq[:u].cpu().numpy(), inverse.cpu().numpy()
    order, segments = order.cpu().numpy(), segments[:u + 1].cpu().numpy()
    assert np.array_equal(uniq, np.unique(keys))  # ascending
    assert np.array_equal(uniq[inverse], keys)
    assert segments[0] == 0 and segments[-1] == n
    assert np.all(np.diff(segments) > 0)
    assert np.array_equal(np.sort(order), np.arange(n))
    seg_of = np.repeat(np.arange(u), np.diff(segments))
    assert np.array_equal(keys[order], uniq[seg_of])
    # Ascending entries within each key: the order combine_backward sums in.
    assert np.all((np.diff(order) > 0) | (np.diff(seg_of) > 0))


def filled_table(dtype, dim, seed, keys, slots):
    table = sg.HashTable(dim,
                         torch.int32 if dtype == "int32" else torch.int64,
                         init="uniform",
                         a=-1,
                         b=1,
                         seed=seed,
                         capacity=1024)
    for s, value in enumerate(slots):
        table.add_slot(f"s{s}", value)
    table.find_or_insert(tensor(keys))
    return table


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("dim", [4, 7, 128])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_lookup_combine_rows(dtype, dim, combiner):
    batch = 3000
    offsets = ragged(batch, 5)
    nnz = int(offsets[-1])
    keys = batch_keys(dtype, nnz)
    table = filled_table(dtype, dim, int(RNG.integers(1 << 40)), keys[:nnz // 2], [])
    uniq, inverse, _, _, num = sg.unique_segmented(tensor(keys))
    u = int(num.item())
    row_ids = torch.full((u,), -9, dtype=torch.int64, device="cuda")
    table.find_or_insert(uniq[:u], row_ids=row_ids)
    weights = RNG.uniform(0.1, 2.0, nnz).astype(np.float32)
    out = table.lookup_combine_rows(row_ids, inverse, tensor(offsets),
                                    torch.full((batch, dim), float("nan"), device="cuda"),
                                    tensor(weights), combiner)
    values = table.find(tensor(keys), torch.empty((nnz, dim), device="cuda"))
    ref = combine_reference(values.cpu().numpy(), np.arange(nnz), weights, offsets, combiner)
    assert rel_err(out.cpu().numpy(), ref) < 1e-5


def export_sorted(table):
    keys, rows, freqs, versions = (t.cpu().numpy() for t in table.export())
    o = np.argsort(keys)
    return keys[o], rows[o], freqs[o], versions[o]


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl", "momentum", "rmsprop"])
@pytest.mark.parametrize("dim", [1, 8, 37, 128, 1000])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_backward_apply_matches_unfused(kind, dim, combiner, weighted):
    dtype = "int64" if dim % 2 else "int32"
    batch = 2000 if dim <= 128 else 300
    offsets = ragged(batch, 4)
    nnz = int(offsets[-1])
    keys = batch_keys(dtype, nnz)
    seed = int(RNG.integers(1 << 40))
    old = keys[RNG.random(nnz) < 0.5]  # half the keys exist before the step
    extra = batch_keys(dtype, 500)  # rows the step must not touch
    tables = [
        filled_table(dtype, dim, seed, np.concatenate([old, extra]), [0.1, 0.2, 0.3])
        for _ in range(2)
    ]
    grad_out = tensor(RNG.standard_normal((batch, dim)).astype(np.float32))
    weights = tensor(RNG.uniform(0.1, 2.0, nnz).astype(np.float32)) if weighted else None
    hp = dict(HP, use_nesterov=bool(RNG.integers(2)), centered=bool(RNG.integers(2)))
    step = 7
    # Unfused: unique, find_or_insert, combine_backward, update_rows, optimizer.
    uniq, inverse, _, num = sg.unique(tensor(keys), counts=False)
    u = int(num.item())
    tables[0].find_or_insert(uniq[:u])
    grad_u = sg.combine_backward(grad_out, inverse, tensor(offsets), u,
                                 torch.empty((u, dim), device="cuda"), weights, combiner)
    ptrs = torch.empty(u, dtype=torch.int64, device="cuda")
    tables[0].update_rows(uniq[:u], step, ptrs)
    sg.apply_optimizer(kind, ptrs, grad_u, dim, **hp)
    # Fused: unique_segmented, find_or_insert(row_ids), backward_apply.
    uniq2, _, order, segments, num2 = sg.unique_segmented(tensor(keys))
    u2 = int(num2.item())
    row_ids = torch.full((u2,), -9, dtype=torch.int64, device="cuda")
    tables[1].find_or_insert(uniq2[:u2], row_ids=row_ids)
    tables[1].backward_apply(kind, grad_out, tensor(offsets), nnz, order, segments, num2, nnz,
                             row_ids, step, weights, combiner, **hp)
    a, b = export_sorted(tables[0]), export_sorted(tables[1])
    for x, y in zip(a, b):
        assert np.array_equal(
            x.view(np.int32) if x.dtype == np.float32 else x,
            y.view(np.int32) if y.dtype == np.float32 else y)
    assert np.all(np.isfinite(b[1]))
