"""unique (single and grouped over tables), partition, the sample-id check,
row offsets, combine forward/backward and the optimizers on the GPU vs NumPy /
float64 references. Fresh random inputs every run; every output is poisoned
(NaN / -7) before the call."""
import numpy as np
import pytest

from sokev_gpu_reference import (OPTIMIZER_HYPERPARAMETERS, SKIP_REASON, combine_backward_reference,
                                 combine_reference, owner_of, rel_err, zipf_keys)

if SKIP_REASON is None:
    import torch
    import sokev_gpu as sg

RNG = np.random.default_rng()
DTYPES = ["int32", "int64"]


def tensor(array):
    return torch.from_numpy(np.ascontiguousarray(array)).cuda()


def poison(shape, dtype):
    if dtype == torch.float32:
        return torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    return torch.full(shape, -7, dtype=dtype, device="cuda")


def keys_for(dtype, n, skew):
    np_dtype = np.int32 if dtype == "int32" else np.int64
    if skew == "zipf":
        return zipf_keys(RNG, n, 1 << 20, dtype=np_dtype)
    lo, hi = (-(1 << 31), (1 << 31) - 1) if dtype == "int32" else (-(1 << 62), 1 << 62)
    base = RNG.integers(lo, hi, size=max(n // 3, 1), dtype=np.int64)
    return RNG.choice(base, n).astype(np_dtype)  # duplicates


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("skew", ["uniform", "zipf"])
@pytest.mark.parametrize("n", [1, 1000, 300_000])
def test_unique(dtype, skew, n):
    keys = keys_for(dtype, n, skew)
    k = tensor(keys)
    uniq, inverse, counts, num = sg.unique(k)
    torch.cuda.synchronize()
    m = int(num.item())
    ref_u, ref_c = np.unique(keys, return_counts=True)
    assert m == len(ref_u)
    u = uniq[:m].cpu().numpy()
    assert np.array_equal(np.sort(u), ref_u)
    assert np.array_equal(u[inverse.cpu().numpy()], keys)
    order = np.argsort(u)
    assert np.array_equal(counts[:m].cpu().numpy()[order], ref_c)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_partition_by_owner(dtype, workers):
    n = 200_000
    keys = keys_for(dtype, n, "zipf")
    kbo, pos, counts = sg.partition(tensor(keys), workers,
                                    poison((n,), torch.int64 if dtype == "int64" else torch.int32),
                                    poison((n,), torch.int64), poison((workers,), torch.int64))
    torch.cuda.synchronize()
    owners = owner_of(keys, workers)
    ref_pos = np.argsort(owners, kind="stable")
    assert np.array_equal(pos.cpu().numpy(), ref_pos)
    assert np.array_equal(kbo.cpu().numpy(), keys[ref_pos])
    assert np.array_equal(counts.cpu().numpy(), np.bincount(owners, minlength=workers))


@pytest.mark.parametrize("layout", ["sample_ids", "sparse_tensor_indices"])
def test_row_offsets_count_each_samples_entries(layout):
    batch = 5000
    sizes = RNG.integers(0, 5, batch)
    ids = np.repeat(np.arange(batch), sizes)
    if layout == "sparse_tensor_indices":  # column 0 read in place
        ids = np.stack([ids, np.concatenate([np.arange(k) for k in sizes])], axis=1)
    out = sg.row_offsets(tensor(ids), batch, poison((batch + 1,), torch.int64))
    ref = np.concatenate([[0], np.cumsum(sizes)])
    assert np.array_equal(out.cpu().numpy(), ref)


def ragged(batch, max_hot):
    sizes = RNG.integers(0, max_hot + 1, batch)
    sizes[RNG.integers(0, batch, batch // 10)] = 0  # empty rows
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def grouping(index, num_unique):
    """(order, segments) of entries grouped by unique index, ascending."""
    order = np.argsort(index, kind="stable").astype(np.int64)
    segments = np.concatenate([[0], np.cumsum(np.bincount(index, minlength=num_unique))])
    return order, segments.astype(np.int64)


@pytest.mark.parametrize("dim", [1, 3, 8, 37, 128, 200, 1024])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_combine_forward_backward(dim, combiner, weighted):
    batch = 700 if dim < 512 else 150
    offsets = ragged(batch, 7)
    nnz = int(offsets[-1])
    num_unique = max(nnz // 3, 1)
    index = RNG.integers(0, num_unique, nnz).astype(np.int64)
    values = RNG.standard_normal((num_unique, dim)).astype(np.float32)
    weights = RNG.uniform(0.1, 2.0, nnz).astype(np.float32) if weighted else None
    out = sg.combine_forward(tensor(values), tensor(index), tensor(offsets),
                             poison((batch, dim), torch.float32),
                             None if weights is None else tensor(weights), combiner)
    ref = combine_reference(values, index, weights, offsets, combiner)
    assert rel_err(out.cpu().numpy(), ref) < 1e-5
    grad_out = RNG.standard_normal((batch, dim)).astype(np.float32)
    order, segments = grouping(index, num_unique)
    grad = sg.combine_backward(tensor(grad_out), tensor(order), tensor(segments), num_unique,
                               tensor(offsets), poison((num_unique, dim), torch.float32),
                               None if weights is None else tensor(weights), combiner)
    ref_g = combine_backward_reference(grad_out, index, weights, offsets, combiner, num_unique)
    assert rel_err(grad.cpu().numpy(), ref_g) < 1e-5


@pytest.mark.parametrize("dim", [7, 128])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_hot_keys_with_thousands_of_entries_sum_like_the_reference(dim, combiner):
    # Zipf-hot keys are summed in chunks (cc/segment_sum_gpu.h): key 0 has
    # about 40% of the entries, key 1 10%, the rest spread out.
    batch = 6000
    offsets = ragged(batch, 4)
    nnz = int(offsets[-1])
    num_unique = 500
    draw = RNG.random(nnz)
    index = np.where(draw < 0.4, 0, np.where(draw < 0.5, 1, RNG.integers(2, num_unique,
                                                                         nnz))).astype(np.int64)
    weights = RNG.uniform(0.1, 2.0, nnz).astype(np.float32)
    grad_out = RNG.standard_normal((batch, dim)).astype(np.float32)
    order, segments = grouping(index, num_unique)
    assert np.diff(segments).max() > 20 * 128  # chunked for sure
    grad = sg.combine_backward(tensor(grad_out), tensor(order), tensor(segments), num_unique,
                               tensor(offsets), poison((num_unique, dim), torch.float32),
                               tensor(weights), combiner)
    ref = combine_backward_reference(grad_out, index, weights, offsets, combiner, num_unique)
    assert rel_err(grad.cpu().numpy(), ref) < 1e-5


@pytest.mark.parametrize("dim", [4, 7, 128])
def test_keys_on_tile_edges_and_across_many_tiles_sum_like_the_reference(dim):
    # Segment sums run in tiles of 32 grouped entries (cc/segment_sum_gpu.h).
    # Keys of exactly one tile, keys ending or starting on a tile edge, keys
    # without entries between them, and one key over 31 tiles. A key inside
    # one tile is the float32 sum of its entries in grouped order, bit for
    # bit; a key across tiles only rounds differently.
    lengths = np.array([32, 0, 31, 1, 33, 0, 0, 64, 1000, 2, 30, 0], np.int64)
    num_unique = len(lengths)
    index = RNG.permutation(np.repeat(np.arange(num_unique), lengths)).astype(np.int64)
    nnz = len(index)
    offsets = np.arange(nnz + 1, dtype=np.int64)  # one entry a sample
    grad_out = RNG.standard_normal((nnz, dim)).astype(np.float32)
    order, segments = grouping(index, num_unique)
    grad = sg.combine_backward(tensor(grad_out), tensor(order), tensor(segments), num_unique,
                               tensor(offsets), poison((num_unique, dim), torch.float32), None,
                               "sum").cpu().numpy()
    ref = combine_backward_reference(grad_out, index, None, offsets, "sum", num_unique)
    assert rel_err(grad, ref) < 1e-5
    for u in range(num_unique):
        begin, end = segments[u], segments[u + 1]
        if begin == end:
            assert np.array_equal(grad[u], np.zeros(dim, np.float32)), f"key {u}"
        elif begin // 32 == (end - 1) // 32:
            in_order = np.zeros(dim, np.float32)
            for k in range(begin, end):
                in_order = in_order + grad_out[order[k]]
            assert np.array_equal(grad[u], in_order), f"key {u}"


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_samples_whose_weights_sum_to_zero_give_zeros_and_zero_gradient(combiner):
    # tf.nn.embedding_lookup_sparse divides with div_no_nan: sample 0's
    # weights are all zero, sample 1's cancel out ('mean' only).
    dim, num_unique = 8, 4
    offsets = np.array([0, 2, 4, 5], np.int64)
    index = np.array([0, 1, 2, 3, 0], np.int64)
    weights = np.array([0.0, 0.0, 1.5, -1.5, 0.5], np.float32)
    values = RNG.standard_normal((num_unique, dim)).astype(np.float32)
    out = sg.combine_forward(tensor(values), tensor(index), tensor(offsets),
                             poison((3, dim), torch.float32), tensor(weights),
                             combiner).cpu().numpy()
    assert np.array_equal(out[0], np.zeros(dim, np.float32))
    if combiner == "mean":
        assert np.array_equal(out[1], np.zeros(dim, np.float32))
    assert np.all(np.isfinite(out))
    order, segments = grouping(index, num_unique)
    grad = sg.combine_backward(tensor(RNG.standard_normal((3, dim)).astype(np.float32)),
                               tensor(order), tensor(segments), num_unique, tensor(offsets),
                               poison((num_unique, dim), torch.float32), tensor(weights),
                               combiner).cpu().numpy()
    assert np.all(np.isfinite(grad))
    assert np.array_equal(grad[1], np.zeros(dim, np.float32))  # only in sample 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes", ["one", "mixed", "criteo"])
def test_unique_grouped_deduplicates_each_table_on_its_own(dtype, sizes):
    counts_of = {
        "one": [5000],
        "mixed": [0, 700, 1, 0, 3000, 0],
        "criteo": list(RNG.integers(0, 4000, 26))
    }[sizes]
    # Tables share keys, so a key must stay apart per table.
    tables = [keys_for(dtype, c, "zipf") for c in counts_of]
    keys = np.concatenate(tables) if tables else np.zeros(0)
    key_offsets = np.concatenate([[0], np.cumsum(counts_of)]).astype(np.int64)
    uniq, counts, inverse, order, segments, unique_offsets = sg.unique_grouped(
        tensor(keys), tensor(key_offsets))
    uniq, counts, inverse, order = (t.cpu().numpy() for t in (uniq, counts, inverse, order))
    segments, unique_offsets = segments.cpu().numpy(), unique_offsets.cpu().numpy()
    assert unique_offsets[0] == 0
    for t, table in enumerate(tables):
        lo, hi = unique_offsets[t], unique_offsets[t + 1]
        ref_u, ref_c = np.unique(table, return_counts=True)
        assert np.array_equal(uniq[lo:hi], ref_u)  # ascending, this table's only
        assert np.array_equal(counts[lo:hi], ref_c)
        first, last = key_offsets[t], key_offsets[t + 1]
        local = inverse[first:last] - lo
        assert np.array_equal(ref_u[local], table)
        # Entries of table t stay in its range, grouped by key, ascending.
        assert np.array_equal(np.sort(order[first:last]), np.arange(first, last))
        seg = segments[lo:hi + 1]
        assert seg[0] == first and seg[-1] == last
        seg_of = np.repeat(np.arange(hi - lo), np.diff(seg))
        assert np.array_equal(keys[order[first:last]], ref_u[seg_of])
        assert np.all((np.diff(order[first:last]) > 0) | (np.diff(seg_of) > 0))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("num_runs", [1, 2, 3])
def test_unique_of_sorted_runs_merges_them_to_the_sorts_outputs(dtype, num_runs):
    # An owner's keys: per table, each worker's unique keys ascending (some
    # runs empty, keys shared between runs and tables).
    lengths = RNG.integers(0, 3000, size=(5, num_runs))
    lengths[1, :] = 0
    runs = [[np.sort(RNG.choice(np.arange(-4000, 4000), size=int(c), replace=False))
             for c in row]
            for row in lengths]
    keys = np.concatenate([np.zeros(0)] + [r for row in runs for r in row]).astype(dtype)
    key_offsets = np.concatenate([[0], np.cumsum(lengths.sum(axis=1))]).astype(np.int64)
    run_offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))]).astype(np.int64)
    merged, unsorted = sg.unique_of_runs_grouped(tensor(keys), tensor(key_offsets),
                                                 tensor(run_offsets), num_runs)
    assert not unsorted  # the merge's outputs stand: no sort was needed
    sorted_ = sg.unique_grouped(tensor(keys), tensor(key_offsets))
    num_unique = int(sorted_[5][-1])
    for got, want, size in zip(merged, sorted_, [num_unique] * 2 + [len(keys)] * 2 +
                               [num_unique + 1, len(lengths) + 1]):
        np.testing.assert_array_equal(got.cpu().numpy()[:size], want.cpu().numpy()[:size])


@pytest.mark.parametrize("fault", ["descending", "repeated"])
def test_unique_of_runs_flags_a_run_out_of_order(fault):
    runs = [np.arange(0, 40, 2), np.arange(1, 41, 2)]
    if fault == "descending":
        runs[1] = runs[1][::-1].copy()
    else:
        runs[1][7] = runs[1][6]
    keys = np.concatenate(runs).astype(np.int64)
    run_offsets = np.array([0, len(runs[0]), len(keys)], np.int64)
    _, unsorted = sg.unique_of_runs_grouped(tensor(keys), tensor(np.array([0, len(keys)],
                                                                          np.int64)),
                                            tensor(run_offsets), 2)
    assert unsorted


def test_first_invalid_sample_ids_finds_the_first_bad_entry_of_each_table():
    batch = 50
    good = np.repeat(np.arange(batch), RNG.integers(0, 4, batch)).astype(np.int64)
    cases = [good, good.copy(), good.copy(), good.copy(), np.zeros(0, np.int64)]
    cases[1][len(good) // 2] = batch  # outside the batch
    cases[2][len(good) // 3] = -1  # negative
    j = len(good) // 4 + 1  # out of order
    cases[3][j] = cases[3][j - 1] - 1 if cases[3][j - 1] > 0 else batch + 3
    expected = [len(good), len(good) // 2, len(good) // 3, j, 0]
    got = sg.first_invalid_sample_ids([tensor(c) for c in cases], [batch] * len(cases))
    assert got.cpu().numpy().tolist() == expected


def optimizer_reference(kind, row, g, dim, hp):
    """float64 reference of update_row for one row (value, slots)."""
    v = row[:dim].copy()
    s = [row[(1 + k) * dim:(2 + k) * dim].copy() for k in range(3)]
    lr = hp["lr"]
    if kind == "sgd":
        v -= lr * g
    elif kind == "adagrad":
        s[0] += g * g
        v -= lr * g / np.sqrt(s[0])
    elif kind == "adam":
        lr_t = lr * np.sqrt(1 - hp["beta2_power"]) / (1 - hp["beta1_power"])
        s[0] = hp["beta1"] * s[0] + (1 - hp["beta1"]) * g
        s[1] = hp["beta2"] * s[1] + (1 - hp["beta2"]) * g * g
        v -= lr_t * s[0] / (np.sqrt(s[1]) + hp["epsilon"])
    elif kind == "ftrl":
        gs = g + 2 * hp["l2_shrinkage"] * v
        new_acc = s[0] + g * g
        s[1] += gs - (np.sqrt(new_acc) - np.sqrt(s[0])) / lr * v
        quad = np.sqrt(new_acc) / lr + 2 * hp["l2"]
        v = np.where(np.abs(s[1]) > hp["l1"], (np.sign(s[1]) * hp["l1"] - s[1]) / quad, 0.0)
        s[0] = new_acc
    elif kind == "momentum":
        s[0] = s[0] * hp["momentum"] + g
        v -= (g * lr + s[0] * hp["momentum"] * lr) if hp["use_nesterov"] else lr * s[0]
    elif kind == "rmsprop":
        s[0] += (g * g - s[0]) * (1 - hp["decay"])
        den = s[0] + hp["epsilon"]
        if hp["centered"]:
            s[2] += (g - s[2]) * (1 - hp["decay"])
            den -= s[2] * s[2]
        s[1] = s[1] * hp["momentum"] + lr * g / np.sqrt(den)
        v -= s[1]
    return np.concatenate([v] + s)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl", "momentum", "rmsprop"])
@pytest.mark.parametrize("dim", [1, 8, 128, 1000])
def test_optimizers(kind, dim):
    # Distinct keys, one gradient each: the fused apply on rows set through
    # insert_or_assign equals the float64 update of every row.
    n = 2000 if dim <= 128 else 300
    width = 4 * dim  # value + 3 slots
    hp = dict(OPTIMIZER_HYPERPARAMETERS,
              use_nesterov=bool(RNG.integers(2)),
              centered=bool(RNG.integers(2)))
    rows = RNG.standard_normal((n, width)).astype(np.float32)
    rows[:, dim:] = np.abs(rows[:, dim:]) + 0.1  # accumulators positive
    rows[:, 3 * dim:] *= 0.01  # centered RMSProp: mean grad^2 < rms
    grads = RNG.standard_normal((n, dim)).astype(np.float32)
    keys = RNG.choice(1 << 40, n, replace=False).astype(np.int64)
    table = sg.HashTable(dim, torch.int64, capacity=n)
    for s in range(3):
        table.add_slot(f"s{s}", 0.0)
    table.insert_or_assign(tensor(keys), tensor(rows))
    row_ids = table.find_or_insert_rows(tensor(keys), poison((n,), torch.int64))
    identity = torch.arange(n + 1, dtype=torch.int64, device="cuda")
    table.backward_apply(kind, tensor(grads), identity, n, identity, identity, identity[n:], n,
                         row_ids, 3, **hp)
    got_keys, got_rows, _, versions = (t.cpu().numpy() for t in table.export())
    out = got_rows[np.argsort(got_keys)][np.argsort(np.argsort(keys))]
    ref = np.stack([
        optimizer_reference(kind, rows[i].astype(np.float64), grads[i].astype(np.float64), dim, hp)
        for i in range(n)
    ])
    assert rel_err(out, ref) < 1e-5
    assert np.all(versions == 3)
