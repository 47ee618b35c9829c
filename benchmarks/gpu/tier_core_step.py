"""The tier moves alone, through the GPU harness (no TensorFlow): the shape
of tf_tiered_step.py (26 tables, dim 128 and an Adagrad slot, --rows keys
pre-filled, Zipf 1.1 batches of --batch ids a table) with an HBM budget of
--fraction of each table's state. Each step makes every table's distinct
keys resident in one TieredTable::make_resident_together call, then looks
them up in HBM (find_or_insert: new keys made, frequencies counted). The
host tier's work runs on --threads std::threads (each count a run), so that
a slow TF step can be split between the tier's own code and the framework
around it. Prints ms a step and the tier counters' host times a step
(summed over tables).

Needs PyTorch and the harness library (cc/gpu_harness/build.sh), no sok-ev:
  SOKEV_GPU_LIB=cc/gpu_harness/build/libsokev_gpu.so \\
      python3 benchmarks/gpu/tier_core_step.py [--rows 10000000] [--threads 1,16]
"""
import argparse
import ctypes
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_sparse_step import DIM, TABLES, batch_ids, raw_keys, rows_per_table  # pylint: disable=wrong-import-position

# TierCounters' fields, in order (cc/storage_spec.h).
FIELDS = ("hits", "misses", "rows_to_hbm", "rows_to_host", "pcie_bytes", "calls", "hbm_rows",
          "host_rows", "choose_us", "write_back_us", "bring_in_us", "host_tier_us", "wait_us")
ROW_WIDTH = 2 * DIM  # value and the Adagrad slot
FILL_CHUNK = 1 << 20


def _library():
    library = ctypes.CDLL(os.environ["SOKEV_GPU_LIB"])
    library.sokev_last_error.restype = ctypes.c_char_p
    return library


class TieredTables:
    """TABLES tiered tables of the harness, each with an Adagrad slot."""

    def __init__(self, lib, budget_bytes, threads):
        self.lib, self.threads = lib, threads
        self.stream = torch.cuda.current_stream().cuda_stream
        self.handles, self.hbm = [], []
        for _ in range(TABLES):
            handle, hbm, index = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
            self._check(
                lib.sokev_tiered_create(ctypes.c_int64(DIM), ctypes.c_int64(budget_bytes), 1,
                                        ctypes.c_uint64(self.stream), ctypes.byref(handle),
                                        ctypes.byref(hbm)))
            self._check(
                lib.sokev_tiered_add_slot(handle, b"accumulator", ctypes.c_float(0.1),
                                          ctypes.c_uint64(self.stream), ctypes.byref(index)))
            self.handles.append(handle)
            self.hbm.append(hbm)

    def _check(self, rc):
        if rc:
            raise RuntimeError(self.lib.sokev_last_error().decode())

    def fill(self, t, keys):
        """Inserts `keys` (device int64) into table t with zero rows."""
        for start in range(0, keys.numel(), FILL_CHUNK):
            chunk = keys[start:start + FILL_CHUNK]
            rows = torch.zeros((chunk.numel(), ROW_WIDTH), device="cuda")
            counts = torch.ones(chunk.numel(), device="cuda", dtype=torch.int64)
            self._check(
                self.lib.sokev_tiered_insert_or_assign(self.handles[t],
                                                       ctypes.c_uint64(chunk.data_ptr()),
                                                       ctypes.c_int64(chunk.numel()),
                                                       ctypes.c_uint64(rows.data_ptr()),
                                                       ctypes.c_uint64(counts.data_ptr()),
                                                       ctypes.c_uint64(counts.data_ptr()),
                                                       self.threads, ctypes.c_uint64(self.stream)))

    def step(self, keys, values):
        """Every table's keys[t] made resident in one call, then looked up."""
        handles = (ctypes.c_void_p * TABLES)(*[h.value for h in self.handles])
        pointers = (ctypes.c_uint64 * TABLES)(*[k.data_ptr() for k in keys])
        counts = (ctypes.c_int64 * TABLES)(*[k.numel() for k in keys])
        self._check(
            self.lib.sokev_tiered_make_resident(handles, pointers, counts, TABLES, self.threads,
                                                ctypes.c_uint64(self.stream)))
        for t in range(TABLES):
            self._check(
                self.lib.sokev_table_find_or_insert(self.hbm[t],
                                                    ctypes.c_uint64(keys[t].data_ptr()),
                                                    ctypes.c_int64(keys[t].numel()),
                                                    ctypes.c_uint64(values.data_ptr()),
                                                    ctypes.c_uint64(0), ctypes.c_uint64(0),
                                                    ctypes.c_uint64(self.stream)))

    def counters(self):
        """The tables' counters, summed."""
        total = np.zeros(len(FIELDS), np.int64)
        for handle in self.handles:
            out = (ctypes.c_int64 * len(FIELDS))()
            self._check(self.lib.sokev_tiered_counters(handle, ctypes.c_uint64(self.stream), out))
            total += np.array(out[:], np.int64)
        return dict(zip(FIELDS, total.tolist()))

    def close(self):
        for handle in self.handles:
            self.lib.sokev_tiered_destroy(handle)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--sets", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--threads", default="1,16")
    args = parser.parse_args()
    lib = _library()
    rows = rows_per_table(args)
    budget = int(args.fraction * rows * 4 * ROW_WIDTH)
    ids = batch_ids(args, 1)
    batches = [[
        torch.unique(torch.from_numpy(raw_keys(t, ids[s][t])).cuda()) for t in range(TABLES)
    ] for s in range(args.sets)]
    values = torch.empty((args.batch, DIM), device="cuda")
    print(
        f"{TABLES} tables × {rows:,} keys, dim {DIM} + an Adagrad slot; budget "
        f"{args.fraction:.0%} of each table's state ({budget / 1e6:.1f} MB); batch {args.batch}, "
        f"Zipf 1.1; {args.steps} steps after 3 warm-up",
        flush=True)
    for threads in (int(t) for t in args.threads.split(",")):
        tables = TieredTables(lib, budget, threads)
        start = time.perf_counter()
        for t in range(TABLES):
            tables.fill(t, torch.from_numpy(raw_keys(t, np.arange(rows))).cuda())
        torch.cuda.synchronize()
        fill_s = time.perf_counter() - start
        for s in range(3):
            tables.step(batches[s % args.sets], values)
        torch.cuda.synchronize()
        before = tables.counters()
        times = []
        for s in range(args.steps):
            start = time.perf_counter()
            tables.step(batches[(s + 3) % args.sets], values)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        after = tables.counters()
        moved = {k: (after[k] - before[k]) / args.steps for k in FIELDS}
        looked = moved["hits"] + moved["misses"]
        print(
            f"host threads {threads:2d}: {np.median(times):7.2f} ms a step (fill {fill_s:.1f} s); "
            f"hits {100 * moved['hits'] / max(looked, 1):.1f}%, rows to HBM "
            f"{moved['rows_to_hbm']:,.0f}, to host {moved['rows_to_host']:,.0f}; host ms a step: "
            f"choose {moved['choose_us'] / 1e3:.1f}, write back {moved['write_back_us'] / 1e3:.1f}, "
            f"bring in {moved['bring_in_us'] / 1e3:.1f}; of which host tier "
            f"{moved['host_tier_us'] / 1e3:.1f}, waits {moved['wait_us'] / 1e3:.1f}",
            flush=True)
        tables.close()


if __name__ == "__main__":
    main()
