"""The host-memory tier of a GPU table with HBM_DRAM storage (cc/host_tier.h),
on the CPU: its map from key to record and its records, against a Python dict.

On a GPU the tier's records are pinned memory that kernels read and write
(tests/test_tiered_storage.py trains through it); here tests/host_tier_shim.cc
gives it malloc'd memory, a cap on the chunks it may allocate, and a thread a
shard, and these tests drive it through ctypes. g++ builds the shim with
AddressSanitizer off (ctypes cannot load it into an uninstrumented Python).
"""

import ctypes
import os
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESOURCE_EXHAUSTED = 3


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("host_tier") / "libhost_tier.so")
    subprocess.run([
        "g++", "-std=c++17", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-I", ROOT,
        os.path.join(ROOT, "cc", "host_tier_cpu.cc"),
        os.path.join(ROOT, "tests", "host_tier_shim.cc"), "-o", path, "-lpthread"
    ],
                   check=True)
    library = ctypes.CDLL(path)
    library.host_tier_new.restype = ctypes.c_void_p
    library.host_tier_new.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    library.host_tier_last_error.restype = ctypes.c_char_p
    for name in ("delete", "live_chunks", "size", "row_width", "erase", "find", "export",
                 "evict_stale"):
        getattr(library, "host_tier_" + name).restype = ctypes.c_int64
    return library


def _pointer(array):
    return array.ctypes.data_as(ctypes.c_void_p)


class Tier:
    """One HostTier through the shim, with numpy in and out."""

    def __init__(self, lib, key_dtype, row_width, chunks_allowed=-1):
        self.lib, self.key_dtype = lib, np.dtype(key_dtype)
        self.handle = ctypes.c_void_p(
            lib.host_tier_new(self.key_dtype.itemsize, row_width, chunks_allowed))

    def close(self):
        """Frees the tier; returns the chunks it left allocated."""
        return self.lib.host_tier_delete(self.handle)

    @property
    def size(self):
        return self.lib.host_tier_size(self.handle)

    @property
    def row_width(self):
        return self.lib.host_tier_row_width(self.handle)

    def insert(self, keys, rows, frequencies, versions):
        keys = np.ascontiguousarray(keys, self.key_dtype)
        code = self.lib.host_tier_insert(self.handle, _pointer(keys), ctypes.c_int64(len(keys)),
                                         _pointer(np.ascontiguousarray(rows, np.float32)),
                                         _pointer(np.ascontiguousarray(frequencies, np.int64)),
                                         _pointer(np.ascontiguousarray(versions, np.int64)))
        return code, self.lib.host_tier_last_error().decode()

    def find(self, keys):
        keys = np.ascontiguousarray(keys, self.key_dtype)
        n = len(keys)
        rows = np.zeros((n, self.row_width), np.float32)
        frequencies, versions = np.zeros(n, np.int64), np.zeros(n, np.int64)
        found = np.zeros(n, np.uint8)
        misaligned = self.lib.host_tier_find(self.handle, _pointer(keys), ctypes.c_int64(n),
                                             _pointer(rows), _pointer(frequencies),
                                             _pointer(versions), _pointer(found))
        assert misaligned == 0, "records must start 16-byte aligned for the GPU's float4 copies"
        return rows, frequencies, versions, found.astype(bool)

    def erase(self, keys):
        keys = np.ascontiguousarray(keys, self.key_dtype)
        return self.lib.host_tier_erase(self.handle, _pointer(keys), ctypes.c_int64(len(keys)))

    def export(self, max_batch):
        n = self.size
        keys = np.zeros(n, self.key_dtype)
        rows = np.zeros((n, self.row_width), np.float32)
        frequencies, versions = np.zeros(n, np.int64), np.zeros(n, np.int64)
        largest = ctypes.c_int64(0)
        count = self.lib.host_tier_export(self.handle, ctypes.c_int64(max_batch), _pointer(keys),
                                          _pointer(rows), _pointer(frequencies), _pointer(versions),
                                          ctypes.byref(largest))
        assert count == n
        return keys, rows, frequencies, versions, largest.value


class Reference:
    """What the tier must hold: key -> (row, frequency, version)."""

    def __init__(self):
        self.rows = {}

    def insert(self, keys, rows, frequencies, versions):
        for key, row, frequency, version in zip(keys, rows, frequencies, versions):
            self.rows[int(key)] = (row.copy(), int(frequency), int(version))

    def erase(self, keys):
        return sum(self.rows.pop(int(key), None) is not None for key in set(keys.tolist()))


def _random_rows(rng, n, width, step):
    return (rng.standard_normal(
        (n, width)).astype(np.float32), rng.integers(1, 100, n), np.full(n, step, np.int64))


def _assert_tier_holds(tier, reference, probe):
    rows, frequencies, versions, found = tier.find(probe)
    assert tier.size == len(reference.rows)
    for i, key in enumerate(probe.tolist()):
        expected = reference.rows.get(key)
        assert found[i] == (expected is not None), key
        if expected is not None:
            np.testing.assert_array_equal(rows[i], expected[0])
            assert (frequencies[i], versions[i]) == expected[1:], key


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_inserted_rows_are_found_until_erased_under_random_inserts_and_erases(lib, key_dtype):
    """Keys drawn from a small range with duplicates inside batches, so the
  map's probe runs grow long and erase's backward shift moves many keys; the
  keys include negative ids and, for int64, ids beyond 32 bits."""
    rng = np.random.default_rng(7)
    width = 6
    tier, reference = Tier(lib, key_dtype, width), Reference()
    span = 1 << 40 if key_dtype == np.int64 else 1 << 30
    universe = rng.integers(-span, span, 5000).astype(key_dtype)
    for step in range(60):
        keys = rng.choice(universe, int(rng.integers(0, 3000)))  # duplicates; some empty
        if rng.random() < 0.55:
            rows, frequencies, versions = _random_rows(rng, len(keys), width, step)
            code, message = tier.insert(keys, rows, frequencies, versions)
            assert code == 0, message
            reference.insert(keys, rows, frequencies, versions)  # the last duplicate wins
        else:
            assert tier.erase(keys) == reference.erase(keys)
        _assert_tier_holds(tier, reference, universe)
    assert tier.close() == 0


def test_erased_records_are_reused_so_steady_churn_allocates_nothing(lib):
    """A tier that writes back and brings in as many rows every step keeps its
  chunks: erased records are reused before any new chunk is taken."""
    rng = np.random.default_rng(3)
    tier = Tier(lib, np.int64, 32)
    keys = np.arange(20000, dtype=np.int64)
    assert tier.insert(keys, *_random_rows(rng, 20000, 32, 0))[0] == 0
    chunks = tier.lib.host_tier_live_chunks(tier.handle)
    for step in range(1, 30):
        out = rng.choice(keys, 5000, replace=False)
        assert tier.erase(out) == 5000
        keys = np.concatenate([np.setdiff1d(keys, out), out + 1000000 * step])
        assert tier.insert(out + 1000000 * step, *_random_rows(rng, 5000, 32, step))[0] == 0
        assert tier.size == 20000
    assert tier.lib.host_tier_live_chunks(tier.handle) == chunks
    assert tier.close() == 0


def test_widening_keeps_every_row_and_sets_the_new_floats_to_the_slots_initial_value(lib):
    rng = np.random.default_rng(5)
    tier, reference = Tier(lib, np.int64, 3), Reference()
    keys = rng.choice(10**9, 3000, replace=False)
    rows, frequencies, versions = _random_rows(rng, 3000, 3, 9)
    assert tier.insert(keys, rows, frequencies, versions)[0] == 0
    assert lib.host_tier_widen(tier.handle, ctypes.c_int64(8), ctypes.c_float(0.25)) == 0
    assert tier.row_width == 8
    widened = np.concatenate([rows, np.full((3000, 5), 0.25, np.float32)], axis=1)
    reference.insert(keys, widened, frequencies, versions)
    _assert_tier_holds(tier, reference, keys)
    assert tier.close() == 0


def test_export_lists_every_key_once_with_its_row_in_batches_of_at_most_max_batch(lib):
    rng = np.random.default_rng(11)
    tier = Tier(lib, np.int32, 4)
    keys = rng.choice(np.arange(-10**6, 10**6), 2500, replace=False).astype(np.int32)
    rows, frequencies, versions = _random_rows(rng, 2500, 4, 2)
    assert tier.insert(keys, rows, frequencies, versions)[0] == 0
    exported, exported_rows, exported_frequencies, _, largest = tier.export(max_batch=300)
    assert largest == 300
    order, exported_order = np.argsort(keys), np.argsort(exported)
    np.testing.assert_array_equal(exported[exported_order], keys[order])
    np.testing.assert_array_equal(exported_rows[exported_order], rows[order])
    np.testing.assert_array_equal(exported_frequencies[exported_order], frequencies[order])
    assert tier.close() == 0


def test_evict_stale_erases_rows_whose_version_is_older_than_step_minus_steps_to_live(lib):
    """DeepRec's steps_to_live: a row last updated at step v goes when
  v < global_step - steps_to_live, as the CPU table's evict_stale."""
    tier = Tier(lib, np.int64, 2)
    keys = np.arange(100, dtype=np.int64)
    versions = np.arange(100, dtype=np.int64)
    assert tier.insert(keys, np.zeros((100, 2)), np.ones(100), versions)[0] == 0
    assert lib.host_tier_evict_stale(tier.handle, ctypes.c_int64(90), ctypes.c_int64(30)) == 60
    found = tier.find(keys)[3]
    np.testing.assert_array_equal(found, versions >= 60)
    assert tier.close() == 0


def test_refused_memory_is_resource_exhausted_naming_the_table_and_keeps_what_was_stored(lib):
    """When the system refuses a chunk, insert fails with ResourceExhausted
  naming the table; every key stored before is still there with its row,
  and the same insert succeeds once memory is there again."""
    rng = np.random.default_rng(13)
    tier, reference = Tier(lib, np.int64, 64, chunks_allowed=40), Reference()
    before = np.arange(1000, dtype=np.int64)
    rows, frequencies, versions = _random_rows(rng, 1000, 64, 1)
    assert tier.insert(before, rows, frequencies, versions)[0] == 0
    reference.insert(before, rows, frequencies, versions)
    more = np.arange(10**6, 10**6 + 200000, dtype=np.int64)
    more_rows = _random_rows(rng, len(more), 64, 2)
    code, message = tier.insert(more, *more_rows)
    assert code == RESOURCE_EXHAUSTED
    assert "Embedding Variable 'host_tier_test'" in message and "host memory" in message
    tier.erase(more)  # what the tiered table does: the keys of a failed write-back go again
    _assert_tier_holds(tier, reference, np.concatenate([before, more[:5000]]))
    lib.host_tier_allow_chunks(tier.handle, ctypes.c_int64(-1))
    assert tier.insert(more, *more_rows)[0] == 0
    reference.insert(more, *more_rows)
    _assert_tier_holds(tier, reference, np.concatenate([before, more[::97]]))
    assert tier.close() == 0
