"""The training step's stages as TensorFlow runs them, checked against each
other and NumPy: unique_segmented vs NumPy, the forward from resolved row ids
vs find + combine, and backward_apply straight from the per-sample gradient
(the fully fused step) vs TensorFlow's two steps (combine_backward gives the
per-key gradient, then the optimizer's apply: backward_apply with one entry
per key), bit for bit. Fresh random inputs every run; outputs poisoned
before each call."""
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
    uniq, _, order, segments, num = sg.unique_segmented(tensor(keys))
    u = int(num.item())
    # TensorFlow's way: the per-key gradient, then the apply of distinct keys.
    grad_u = sg.combine_backward(grad_out, order, segments[:u + 1], u, tensor(offsets),
                                 torch.full((u, dim), float("nan"), device="cuda"), weights,
                                 combiner)
    tables[0].find_or_insert(uniq[:u])
    row_ids0 = tables[0].find_or_insert_rows(uniq[:u],
                                             torch.full((u,), -9, dtype=torch.int64, device="cuda"))
    identity = torch.arange(u + 1, dtype=torch.int64, device="cuda")
    tables[0].backward_apply(kind,
                             grad_u,
                             identity,
                             u,
                             identity,
                             identity,
                             identity[u:],
                             u,
                             row_ids0,
                             step,
                             max_key_entries=1,
                             **hp)
    # Fully fused: backward_apply from the per-sample gradient.
    row_ids = torch.full((u,), -9, dtype=torch.int64, device="cuda")
    tables[1].find_or_insert(uniq[:u], row_ids=row_ids)
    tables[1].backward_apply(kind, grad_out, tensor(offsets), nnz, order, segments, num, nnz,
                             row_ids, step, weights, combiner, **hp)
    a, b = export_sorted(tables[0]), export_sorted(tables[1])
    for x, y in zip(a, b):
        assert np.array_equal(
            x.view(np.int32) if x.dtype == np.float32 else x,
            y.view(np.int32) if y.dtype == np.float32 else y)
    assert np.all(np.isfinite(b[1]))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_apply_of_repeated_keys_sums_them_with_the_count_left_on_the_device(dtype):
    # The optimizer's apply when keys repeat (several workers' gradients for
    # one key): unique_segmented, find_or_insert_rows bounded by the unique
    # count on the device (what lies past it is not keys), backward_apply
    # with one entry per gradient row. Rows that existed equal SGD with the
    # gradients summed per key; frequencies do not change; nothing but the
    # batch's keys is inserted.
    dim, n = 16, 5000
    keys = batch_keys(dtype, n)
    grads = RNG.standard_normal((n, dim)).astype(np.float32)
    table = filled_table(dtype, dim, int(RNG.integers(1 << 40)), keys[:n // 2], [])
    old_keys, old_rows, old_freqs, _ = export_sorted(table)
    uniq, _, order, segments, num = sg.unique_segmented(tensor(keys))
    uniq[int(num.item()):] = 12345
    row_ids = table.find_or_insert_rows(uniq,
                                        torch.full((n,), -9, dtype=torch.int64, device="cuda"),
                                        count=num)
    identity = torch.arange(n + 1, dtype=torch.int64, device="cuda")
    table.backward_apply("sgd",
                         tensor(grads),
                         identity,
                         n,
                         order,
                         segments,
                         num,
                         n,
                         row_ids,
                         4,
                         lr=0.5)
    new_keys, new_rows, new_freqs, versions = export_sorted(table)
    ref_u, inverse = np.unique(keys, return_inverse=True)
    assert np.array_equal(new_keys, ref_u.astype(new_keys.dtype))
    assert np.all(versions == 4)
    summed = np.zeros((len(ref_u), dim))
    np.add.at(summed, inverse.reshape(-1), grads.astype(np.float64))
    existed = np.isin(new_keys, old_keys)
    np.testing.assert_array_equal(new_freqs[existed], old_freqs)
    np.testing.assert_allclose(new_rows[existed],
                               old_rows - 0.5 * summed[existed],
                               rtol=1e-5,
                               atol=1e-5)
