"""ctypes bindings of libsokev_gpu.so (cc/gpu_harness/harness.cu) over torch
CUDA tensors. Every call is ordered on torch's current stream."""
import ctypes
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
LIB_PATH = os.environ.get("SOKEV_GPU_LIB", os.path.join(_HERE, "build", "libsokev_gpu.so"))

COMBINERS = {"sum": 0, "mean": 1, "sqrtn": 2}
OPTIMIZERS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 3, "momentum": 4, "rmsprop": 5}
INIT_KINDS = {"constant": 0, "uniform": 1, "normal": 2, "truncated_normal": 3, "matrix": 4}

_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(LIB_PATH)
        _lib.sokev_last_error.restype = ctypes.c_char_p
        _lib.sokev_table_create.argtypes = [
            ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_float,
            ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
            ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_void_p)
        ]
        _lib.sokev_first_invalid_sample_ids.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_int64),
            ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64
        ]
        _lib.sokev_backward_apply.argtypes = [
            ctypes.c_void_p, ctypes.c_int,
            ctypes.POINTER(ctypes.c_float),
            ctypes.POINTER(ctypes.c_int)
        ] + [ctypes.c_uint64] * 3 + [
            ctypes.c_int64, ctypes.c_int64, ctypes.c_int
        ] + [ctypes.c_uint64] * 3 + [
            ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint64
        ]
        _lib.sokev_table_add_slot.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_float, ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_int)
        ]
    return _lib


class SokevError(RuntimeError):
    pass


def _check(rc):
    if rc != 0:
        raise SokevError(lib().sokev_last_error().decode())


def _p(t):
    """Device address of a tensor, 0 for None."""
    return ctypes.c_uint64(0 if t is None else t.data_ptr())


def _i(x):
    return ctypes.c_int64(int(x))


def _stream():
    return ctypes.c_uint64(torch.cuda.current_stream().cuda_stream)


def _bits(keys):
    return 32 if keys.dtype == torch.int32 else 64


def sync():
    _check(lib().sokev_sync(_stream()))


class HashTable:

    def __init__(self,
                 dim,
                 key_dtype=torch.int64,
                 init="constant",
                 a=0.0,
                 b=0.0,
                 seed=0,
                 default_values=None,
                 capacity=1 << 16,
                 max_load_factor=0.75):
        self.dim = dim
        self.key_dtype = key_dtype
        self._default_values = default_values
        handle = ctypes.c_void_p()
        dvd = 0 if default_values is None else default_values.shape[0]
        _check(lib().sokev_table_create(32 if key_dtype == torch.int32 else 64, dim,
                                        INIT_KINDS[init], a, b, seed,
                                        _p(default_values).value, dvd, capacity, max_load_factor,
                                        _stream().value, ctypes.byref(handle)))
        self.handle = handle

    def __del__(self):
        if getattr(self, "handle", None) and _lib is not None:
            torch.cuda.synchronize()
            _lib.sokev_table_destroy(self.handle)
            self.handle = None

    def size(self):
        out = ctypes.c_int64()
        _check(lib().sokev_table_size(self.handle, _stream(), ctypes.byref(out)))
        return out.value

    def info(self):
        mem, buckets, cap, width = (ctypes.c_uint64(), ctypes.c_int64(), ctypes.c_int64(),
                                    ctypes.c_int64())
        _check(lib().sokev_table_info(self.handle, ctypes.byref(mem), ctypes.byref(buckets),
                                      ctypes.byref(cap), ctypes.byref(width)))
        return dict(memory_bytes=mem.value,
                    buckets=buckets.value,
                    row_capacity=cap.value,
                    row_width=width.value)

    def add_slot(self, name, initial_value):
        index = ctypes.c_int()
        _check(lib().sokev_table_add_slot(self.handle, name.encode(), initial_value,
                                          _stream().value, ctypes.byref(index)))
        return index.value

    def reserve(self, keys):
        _check(lib().sokev_table_reserve(self.handle, _i(keys), _stream()))

    def find_or_insert(self, keys, values=None, frequencies=None, row_ids=None):
        _check(lib().sokev_table_find_or_insert(self.handle, _p(keys), _i(keys.numel()), _p(values),
                                                _p(frequencies), _p(row_ids), _stream()))
        return values

    def find(self, keys, values, found=None, initial_for_missing=False):
        _check(lib().sokev_table_find(self.handle, _p(keys), _i(keys.numel()), _p(values),
                                      _p(found), int(initial_for_missing), _stream()))
        return values

    def insert_or_assign(self, keys, rows, frequencies=None, versions=None):
        _check(lib().sokev_table_insert_or_assign(self.handle, _p(keys), _i(keys.numel()), _p(rows),
                                                  _p(frequencies), _p(versions), _stream()))

    def erase(self, keys, count=True):
        out = ctypes.c_int64()
        _check(lib().sokev_table_erase(self.handle, _p(keys), _i(keys.numel()), _stream(),
                                       ctypes.byref(out) if count else None))
        return out.value

    def find_or_insert_rows(self, keys, row_ids, count=None):
        """Row ids of keys, inserting missing ones, frequencies unchanged;
        with `count` (a device int64 tensor) only the first count keys."""
        _check(lib().sokev_table_find_or_insert_rows(self.handle, _p(keys), _i(keys.numel()),
                                                     _p(count), _p(row_ids), _stream()))
        return row_ids

    def export(self):
        n = self.size()
        width = self.info()["row_width"]
        keys = torch.empty(max(n, 1), dtype=self.key_dtype, device="cuda")
        rows = torch.empty((max(n, 1), width), dtype=torch.float32, device="cuda")
        freqs = torch.empty(max(n, 1), dtype=torch.int64, device="cuda")
        versions = torch.empty(max(n, 1), dtype=torch.int64, device="cuda")
        count = ctypes.c_int64()
        _check(lib().sokev_table_export(self.handle, _p(keys), _p(rows), _p(freqs), _p(versions),
                                        _i(n), _stream(), ctypes.byref(count)))
        c = count.value
        return keys[:c], rows[:c], freqs[:c], versions[:c]

    def rows_for_ids(self, row_ids, global_step, rows):
        """Row pointers (and versions set) for row ids from find_or_insert."""
        _check(lib().sokev_table_rows_for_ids(self.handle, _p(row_ids), _i(row_ids.numel()),
                                              _i(global_step), _p(rows), _stream()))

    def lookup_combine_rows(self, row_ids, inverse, row_offsets, out, weights=None, combiner="sum"):
        """Gather + combine with rows resolved: entry j reads row_ids[inverse[j]]."""
        _check(lib().sokev_lookup_combine_rows(self.handle, _p(row_ids), _p(inverse), _p(weights),
                                               _p(row_offsets), _i(row_offsets.numel() - 1),
                                               COMBINERS[combiner], _p(out), _stream()))
        return out

    def backward_apply(self,
                       kind,
                       grad_out,
                       row_offsets,
                       nnz,
                       order,
                       segments,
                       num_unique,
                       max_unique,
                       row_ids,
                       global_step,
                       weights=None,
                       combiner="sum",
                       max_key_entries=None,
                       **hyper):
        """combine_backward's per-key sums applied with the optimizer in one kernel
        (cc/backward_apply_gpu.h)."""
        h, f = _optimizer_args(**hyper)
        _check(lib().sokev_backward_apply(self.handle, OPTIMIZERS[kind], h, f,
                                          _p(grad_out).value,
                                          _p(weights).value,
                                          _p(row_offsets).value,
                                          row_offsets.numel() - 1, int(nnz), COMBINERS[combiner],
                                          _p(order).value,
                                          _p(segments).value,
                                          _p(num_unique).value, int(max_unique),
                                          int(nnz if max_key_entries is None else max_key_entries),
                                          _p(row_ids).value, int(global_step),
                                          _stream().value))

    def evict_stale(self, global_step, steps_to_live):
        out = ctypes.c_int64()
        _check(lib().sokev_table_evict(self.handle, _i(global_step), _i(steps_to_live), _stream(),
                                       ctypes.byref(out)))
        return out.value


def unique(keys, counts=True):
    n = keys.numel()
    uniq = torch.empty(max(n, 1), dtype=keys.dtype, device=keys.device)
    inverse = torch.empty(max(n, 1), dtype=torch.int64, device=keys.device)
    cnt = torch.empty(max(n, 1), dtype=torch.int64, device=keys.device) if counts else None
    num = torch.empty(1, dtype=torch.int64, device=keys.device)
    _check(lib().sokev_unique(_bits(keys), _p(keys), _i(n), _p(uniq), _p(inverse), _p(cnt), _p(num),
                              _stream()))
    return uniq, inverse[:n], cnt, num


def unique_segmented(keys):
    """unique plus the sort behind it: (uniq, inverse, order, segments, num);
    unique u's entries are order[segments[u]:segments[u + 1]]."""
    n = keys.numel()
    uniq = torch.empty(max(n, 1), dtype=keys.dtype, device=keys.device)
    inverse = torch.empty(max(n, 1), dtype=torch.int64, device=keys.device)
    order = torch.empty(max(n, 1), dtype=torch.int64, device=keys.device)
    segments = torch.empty(n + 1, dtype=torch.int64, device=keys.device)
    num = torch.empty(1, dtype=torch.int64, device=keys.device)
    _check(lib().sokev_unique_segmented(_bits(keys), _p(keys), _i(n), _p(uniq), _p(inverse),
                                        _p(order), _p(segments), _p(num), _stream()))
    return uniq, inverse[:n], order[:n], segments, num


def partition(keys, num_workers, keys_by_owner=None, positions=None, counts=None):
    n = keys.numel()
    if keys_by_owner is None:
        keys_by_owner = torch.empty(max(n, 1), dtype=keys.dtype, device=keys.device)
        positions = torch.empty(max(n, 1), dtype=torch.int64, device=keys.device)
        counts = torch.empty(num_workers, dtype=torch.int64, device=keys.device)
    _check(lib().sokev_partition(_bits(keys), _p(keys), _i(n), num_workers, _p(keys_by_owner),
                                 _p(positions), _p(counts), _stream()))
    return keys_by_owner[:n], positions[:n], counts


def convert_16(src, bits_format):
    """The compressed exchange's conversion on the GPU: float32 -> the int16
  bits of "bfloat16" / "float16", or those bits (int16) -> float32."""
    narrow = src.dtype == torch.float32
    out = torch.empty(src.shape, dtype=torch.int16 if narrow else torch.float32, device=src.device)
    _check(lib().sokev_convert_16({
        "bfloat16": 0,
        "float16": 1
    }[bits_format], int(narrow), _p(src), _i(src.numel()), _p(out), _stream()))
    return out


def row_offsets(sample_ids, batch, out=None):
    """Each sample's first entry, `(batch + 1,)` int64. sample_ids: `(nnz,)`
    int64, or a SparseTensor's `(nnz, rank)` indices (column 0 is read in
    place)."""
    if out is None:
        out = torch.empty(batch + 1, dtype=torch.int64, device=sample_ids.device)
    stride = sample_ids.shape[1] if sample_ids.dim() == 2 else 1
    assert sample_ids.is_contiguous()
    _check(lib().sokev_row_offsets(_p(sample_ids), _i(stride), _i(sample_ids.shape[0]), _i(batch),
                                   _p(out), _stream()))
    return out


def combine_forward(unique_values, unique_index, row_offsets, out, weights=None, combiner="sum"):
    _check(lib().sokev_combine_forward(_p(unique_values), _p(unique_index), _p(weights),
                                       _p(row_offsets), _i(row_offsets.numel() - 1),
                                       _i(out.shape[1]), COMBINERS[combiner], _p(out), _stream()))
    return out


def combine_backward(grad_out,
                     order,
                     segments,
                     num_unique,
                     row_offsets,
                     grad_unique,
                     weights=None,
                     combiner="sum"):
    """Per unique key u: the sum over its entries order[segments[u]:segments[u + 1]]."""
    _check(lib().sokev_combine_backward(_p(grad_out), _p(order), _p(segments), _i(num_unique),
                                        _p(weights), _p(row_offsets), _i(row_offsets.numel() - 1),
                                        _i(order.numel()), _i(grad_out.shape[1]),
                                        COMBINERS[combiner], _p(grad_unique), _stream()))
    return grad_unique


def unique_grouped(keys, key_offsets):
    """unique_segmented over tables side by side: table t's keys are
    keys[key_offsets[t]:key_offsets[t + 1]] (key_offsets an int64 device
    tensor). Returns (uniq, counts, inverse, order, segments,
    unique_offsets), indices global (see cc/unique_partition_gpu.h)."""
    n = keys.numel()
    num_tables = key_offsets.numel() - 1
    uniq = torch.empty(max(n, 1), dtype=keys.dtype, device=keys.device)
    counts = torch.empty(max(n, 1), dtype=torch.int64, device=keys.device)
    inverse = torch.empty(max(n, 1), dtype=torch.int64, device=keys.device)
    order = torch.empty(max(n, 1), dtype=torch.int64, device=keys.device)
    segments = torch.empty(n + 1, dtype=torch.int64, device=keys.device)
    unique_offsets = torch.empty(num_tables + 1, dtype=torch.int64, device=keys.device)
    _check(lib().sokev_unique_grouped(_bits(keys), _p(keys), _i(n), _p(key_offsets), num_tables,
                                      _p(uniq), _p(counts), _p(inverse), _p(order), _p(segments),
                                      _p(unique_offsets), _stream()))
    return uniq, counts, inverse[:n], order[:n], segments, unique_offsets


def unique_of_runs_grouped(keys, key_offsets, run_offsets, num_runs):
    """unique_grouped for keys that come as num_runs sorted runs per table
    (run_offsets an int64 device tensor of num_tables * num_runs + 1
    offsets): the runs merged. Returns unique_grouped's six outputs and
    whether a run was out of order (then they are meaningless)."""
    n = keys.numel()
    num_tables = key_offsets.numel() - 1
    uniq, counts, inverse, order = (torch.empty(max(n, 1), dtype=d, device=keys.device)
                                    for d in (keys.dtype, torch.int64, torch.int64, torch.int64))
    segments = torch.empty(n + 1, dtype=torch.int64, device=keys.device)
    unique_offsets = torch.empty(num_tables + 1, dtype=torch.int64, device=keys.device)
    unsorted = torch.empty(1, dtype=torch.int64, device=keys.device)
    _check(lib().sokev_unique_of_runs_grouped(_bits(keys), _p(keys), _i(n), _p(key_offsets),
                                              _p(run_offsets), num_tables, num_runs, _p(uniq),
                                              _p(counts), _p(inverse), _p(order), _p(segments),
                                              _p(unique_offsets), _p(unsorted), _stream()))
    return (uniq, counts, inverse[:n], order[:n], segments, unique_offsets), bool(unsorted.item())


def first_invalid_sample_ids(sample_ids, batches):
    """Per table, the first entry whose sample id is out of [0, batch) or out
    of order, else its nnz (an int64 device tensor)."""
    count = len(sample_ids)
    out = torch.empty(max(count, 1), dtype=torch.int64, device="cuda")
    addresses = (ctypes.c_uint64 * count)(*[t.data_ptr() for t in sample_ids])
    nnz = (ctypes.c_int64 * count)(*[t.numel() for t in sample_ids])
    batch = (ctypes.c_int64 * count)(*batches)
    _check(lib().sokev_first_invalid_sample_ids(addresses, nnz, batch, count,
                                                _p(out).value,
                                                _stream().value))
    return out[:count]


def _optimizer_args(lr=0.1,
                    beta1=0.9,
                    beta2=0.999,
                    epsilon=1e-8,
                    beta1_power=0.9,
                    beta2_power=0.999,
                    momentum=0.0,
                    l1=0.0,
                    l2=0.0,
                    l2_shrinkage=0.0,
                    lr_power=-0.5,
                    decay=0.9,
                    use_nesterov=False,
                    centered=False,
                    slot_index=(0, 1, 2)):
    """The C ABI's (hyper, flags) arrays of an optimizer."""
    hyper = (ctypes.c_float * 12)(lr, beta1, beta2, epsilon, beta1_power, beta2_power, momentum, l1,
                                  l2, l2_shrinkage, lr_power, decay)
    flags = (ctypes.c_int * 5)(int(use_nesterov), int(centered), *slot_index)
    return hyper, flags
