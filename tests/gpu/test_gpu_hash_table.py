"""gpu::HashTable vs a Python dict: millions of mixed operations with growth,
duplicates within a launch, every key value valid, initializers, slots,
frequencies, versions, export and eviction."""
import numpy as np
import pytest

from sokev_gpu_reference import SKIP_REASON, uniform_rows

if SKIP_REASON is None:
    import torch
    import sokev_gpu as sg

RNG = np.random.default_rng()


def tensor(array):
    return torch.from_numpy(np.ascontiguousarray(array)).cuda()


def nan_poison(shape):
    return torch.full(shape, float("nan"), device="cuda")


def key_range(dtype):
    return ((-(1 << 31), (1 << 31) - 1) if dtype == "int32" else (-(1 << 63), (1 << 63) - 1))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_differential_vs_dict(dtype):
    rounds, ops = (50, 100_000)
    dim = 8
    np_dtype = np.int32 if dtype == "int32" else np.int64
    seed = int(RNG.integers(1 << 40))
    table = sg.HashTable(dim,
                         torch.int32 if dtype == "int32" else torch.int64,
                         init="uniform",
                         a=-0.5,
                         b=0.5,
                         seed=seed,
                         capacity=1024)
    lo, hi = key_range(dtype)
    ref = {}  # key -> value row (float32 array)
    freq = {}
    pool = np.array([lo, hi, 0, -1, 1], dtype=np_dtype)  # edge keys are valid
    for r in range(rounds):
        fresh = RNG.integers(lo, hi, ops // 2, dtype=np.int64, endpoint=True).astype(np_dtype)
        pool = np.concatenate([pool, fresh])
        batch = RNG.choice(pool, ops)  # duplicates and re-used keys
        q = ops // 4
        ins, era, asg, fnd = batch[:q], batch[q:2 * q], batch[2 * q:3 * q], batch[3 * q:]
        # find_or_insert
        values = table.find_or_insert(tensor(ins), nan_poison((q, dim)))
        uniq, counts = np.unique(ins, return_counts=True)
        missing = np.array([k not in ref for k in uniq.tolist()])
        init = uniform_rows(seed, -0.5, 0.5, uniq[missing], dim)
        for k, row in zip(uniq[missing].tolist(), init):
            ref[k] = row
            freq[k] = 0
        for k, c in zip(uniq.tolist(), counts.tolist()):
            freq[k] += c
        expected = np.stack([ref[k] for k in ins.tolist()])
        got = values.cpu().numpy()
        assert np.array_equal(got, expected), f"round {r}: find_or_insert values"
        # erase
        erased = table.erase(tensor(era))
        present = {k for k in np.unique(era).tolist() if k in ref}
        assert erased == len(present), f"round {r}: erase count"
        for k in present:
            del ref[k]
            del freq[k]
        # insert_or_assign (distinct keys: repeats keep an unspecified row)
        asg = np.unique(asg)
        rows = RNG.standard_normal((len(asg), dim)).astype(np.float32)
        table.insert_or_assign(tensor(asg), tensor(rows))
        for k, row in zip(asg.tolist(), rows):
            if k not in ref:
                freq[k] = 0
            ref[k] = row
        # find
        found = torch.zeros(len(fnd), dtype=torch.bool, device="cuda")
        values = table.find(tensor(fnd), nan_poison((len(fnd), dim)), found)
        exp_found = np.array([k in ref for k in fnd.tolist()])
        assert np.array_equal(found.cpu().numpy(), exp_found), f"round {r}: found"
        expected = np.stack([ref.get(k, np.zeros(dim, np.float32)) for k in fnd.tolist()])
        assert np.array_equal(values.cpu().numpy(), expected), f"round {r}: find values"
        assert table.size() == len(ref), f"round {r}: size"
    keys, rows, freqs, _ = table.export()
    keys = keys.cpu().numpy()
    assert len(keys) == len(ref) and len(np.unique(keys)) == len(keys)
    rows = rows.cpu().numpy()
    freqs = freqs.cpu().numpy()
    for i in RNG.choice(len(keys), min(len(keys), 20000), replace=False):
        k = keys[i].item()
        assert np.array_equal(rows[i], ref[k])
        assert freqs[i] == freq[k]


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_duplicates_in_one_launch_insert_once(dtype):
    np_dtype = np.int32 if dtype == "int32" else np.int64
    distinct = RNG.integers(-1000, 1000, 300).astype(np_dtype)
    keys = RNG.choice(distinct, 1_000_000)
    table = sg.HashTable(16,
                         torch.int32 if dtype == "int32" else torch.int64,
                         init="constant",
                         a=1.5,
                         capacity=64)
    row_ids = torch.full((len(keys),), -9, dtype=torch.int64, device="cuda")
    values = table.find_or_insert(tensor(keys), nan_poison((len(keys), 16)), row_ids=row_ids)
    assert table.size() == len(np.unique(keys))
    ids = row_ids.cpu().numpy()
    for k in np.unique(keys)[:50]:
        assert len(np.unique(ids[keys == k])) == 1
    assert np.all(values.cpu().numpy() == 1.5)
    _, _, freqs, _ = table.export()
    assert freqs.sum().item() == len(keys)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_present_keys_do_not_grow_the_table(dtype):
    """Every call after the first brings mostly present keys; the arena and
    the index grow only by the absent ones (a call of n keys used to grow the
    arena to next_row + n, 1.7x raw at ten-hot in the TF benchmark)."""
    np_dtype = np.int32 if dtype == "int32" else np.int64
    torch_dtype = torch.int32 if dtype == "int32" else torch.int64
    dim, capacity = 8, 4096
    keys = RNG.permutation(1 << 20)[:3000].astype(np_dtype)
    table = sg.HashTable(dim, torch_dtype, init="constant", a=0.5, capacity=capacity)
    table.find_or_insert(tensor(keys))
    grown = table.info()
    assert grown["row_capacity"] == capacity
    for _ in range(3):  # the lookup's insert, then the optimizer's, each step
        table.find_or_insert(tensor(RNG.permutation(keys)))
        table.find_or_insert_rows(tensor(keys),
                                  torch.empty(len(keys), dtype=torch.int64, device="cuda"))
        table.insert_or_assign(tensor(keys[:100]), torch.ones((100, dim), device="cuda"))
    assert table.info() == grown
    assert table.size() == len(keys)

    # Keys past the device count are not looked at, so not counted either.
    absent = (np.arange(1500) + (1 << 21)).astype(np_dtype)
    count = torch.tensor([len(keys)], dtype=torch.int64, device="cuda")
    table.find_or_insert_rows(tensor(np.concatenate([keys, absent])),
                              torch.empty(len(keys) + 1500, dtype=torch.int64, device="cuda"),
                              count=count)
    assert table.info() == grown and table.size() == len(keys)

    # New keys among present ones (3000 + 1500 rows > 4096): the arena grows
    # by its factor, every key keeps or gets its row.
    values = table.find_or_insert(tensor(np.concatenate([keys, absent])),
                                  nan_poison((len(keys) + 1500, dim)))
    assert table.size() == len(keys) + 1500
    assert table.info()["row_capacity"] == int(capacity * 1.25)
    expected = np.full((len(keys) + 1500, dim), 0.5, np.float32)
    expected[:100] = 1.0  # insert_or_assign above
    assert np.array_equal(values.cpu().numpy(), expected)


def test_default_value_matrix_and_slots():
    dim, n_default = 5, 7
    matrix = RNG.standard_normal((n_default, dim)).astype(np.float32)
    table = sg.HashTable(dim, torch.int64, init="matrix", default_values=tensor(matrix))
    keys = np.array([-9, -1, 0, 3, 13, 1 << 40], dtype=np.int64)
    table.find_or_insert(tensor(keys[:3]))
    assert table.add_slot("accum", 0.25) == 0
    assert table.add_slot("accum", 0.25) == 0
    assert table.add_slot("m", -1.0) == 1
    values = table.find_or_insert(tensor(keys), nan_poison((len(keys), dim)))
    assert np.array_equal(values.cpu().numpy(), matrix[np.mod(keys, n_default)])
    k, rows, _, _ = table.export()
    rows = rows.cpu().numpy()
    assert rows.shape == (6, 3 * dim)
    assert np.all(rows[:, dim:2 * dim] == 0.25) and np.all(rows[:, 2 * dim:] == -1.0)


def test_versions_and_eviction():
    dim = 4
    table = sg.HashTable(dim, torch.int64, init="constant", a=0.0)
    keys = np.arange(100, dtype=np.int64) * 7919
    ptrs = torch.empty(100, dtype=torch.int64, device="cuda")
    ids = torch.empty(100, dtype=torch.int64, device="cuda")
    for lo, hi, step in ((0, 60, 5), (40, 100, 9)):
        table.find_or_insert_rows(tensor(keys[lo:hi]), ids[lo:hi])
        table.rows_for_ids(ids[lo:hi], step, ptrs[lo:hi])
    k, _, _, versions = table.export()
    ver = dict(zip(k.cpu().numpy().tolist(), versions.cpu().numpy().tolist()))
    assert all(ver[x] == (5 if i < 40 else 9) for i, x in enumerate(keys.tolist()))
    assert table.evict_stale(10, 3) == 40
    assert table.size() == 60
    # Erased rows are reused; the table still answers correctly.
    table.find_or_insert(tensor(keys[:40]))
    assert table.size() == 100


@pytest.mark.parametrize("more_new_keys_than_erased", [True, False])
def test_one_launch_takes_every_erased_row_once_then_fresh_rows(more_new_keys_than_erased):
    """Thousands of inserts in one launch pop the free-row stack together
  (an HBM_DRAM table brings a batch's rows back from host memory so): each
  erased row goes to exactly one new key, the rest come from the arena, and
  no two keys share a row."""
    table = sg.HashTable(4, torch.int64, init="constant", a=0.0)
    first = RNG.choice(1 << 40, 50_000, replace=False).astype(np.int64)
    ids = torch.empty(len(first), dtype=torch.int64, device="cuda")
    table.find_or_insert_rows(tensor(first), ids)
    erased_keys = first[:20_000]
    erased_ids = set(ids[:20_000].cpu().numpy().tolist())
    assert table.erase(tensor(erased_keys)) == len(erased_keys)
    fresh = np.setdiff1d(RNG.choice(1 << 40, 40_000, replace=False).astype(np.int64), first)
    fresh = fresh[:30_000 if more_new_keys_than_erased else 10_000]
    fresh_ids = torch.empty(len(fresh), dtype=torch.int64, device="cuda")
    table.find_or_insert_rows(tensor(fresh), fresh_ids)
    got = fresh_ids.cpu().numpy()
    kept = set(ids[20_000:].cpu().numpy().tolist())
    assert len(set(got.tolist())) == len(got), "two new keys share a row"
    assert not kept & set(got.tolist()), "a new key took a live key's row"
    reused = erased_ids & set(got.tolist())
    assert len(reused) == min(len(got), len(erased_ids)), "erased rows not all reused"
    assert table.size() == len(first) - len(erased_keys) + len(fresh)


def test_rejects_bad_dim():
    with pytest.raises(sg.SokevError, match="dim"):
        sg.HashTable(0, torch.int64)
