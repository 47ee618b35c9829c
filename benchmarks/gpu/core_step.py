"""The sparse training step exactly as sok-ev's TensorFlow ops run it on a
GPU, driven through the harness (cc/gpu_harness) on torch tensors, so that a
harness number is a product number:

  UniqueKeys           unique_grouped over all tables (one sort), one sync
  FindOrInsertCombine  per table: find_or_insert (counts, row ids) +
                       lookup_combine_rows
  CombineBackward      per table: combine_backward (per unique key)
  SparseApplyOptimizer per table: find_or_insert_rows + backward_apply with
                       one entry per key (the keys are distinct)

Used by bench_core.py (T1, T3) and tf_sparse_step.py (the core step on the
same data as TensorFlow's).
"""
import torch

import sokev_gpu as sg


def _local(segment, base):
    return segment - base if base else segment


class CoreSparseStep:
    """Forward + backward + optimizer over `tables` (sg.HashTable, one per
    feature), as the TF GPU kernels do it."""

    def __init__(self, tables, optimizer="adagrad", **hyperparameters):
        self.tables = tables
        self.optimizer = optimizer
        self.hyperparameters = hyperparameters

    def forward(self, keys, offsets):
        """keys, offsets: per table, int64 (nnz_t,) and (batch_t + 1,) CUDA
        tensors. Returns (outputs, state for backward)."""
        key_offsets = [0]
        for k in keys:
            key_offsets.append(key_offsets[-1] + k.numel())
        all_keys = torch.cat(keys) if len(keys) > 1 else keys[0]
        uniq, counts, inverse, order, segments, unique_offsets = sg.unique_grouped(
            all_keys, torch.tensor(key_offsets, dtype=torch.int64, device="cuda"))
        unique_offsets = unique_offsets.tolist()  # the one host sync
        outs, state = [], []
        for t, table in enumerate(self.tables):
            lo, hi = unique_offsets[t], unique_offsets[t + 1]
            first, last = key_offsets[t], key_offsets[t + 1]
            row_ids = torch.empty(max(hi - lo, 1), dtype=torch.int64, device="cuda")
            table.find_or_insert(uniq[lo:hi], frequencies=counts[lo:hi], row_ids=row_ids)
            batch = offsets[t].numel() - 1
            out = torch.empty((batch, table.dim), device="cuda")
            table.lookup_combine_rows(row_ids, _local(inverse[first:last], lo), offsets[t], out)
            outs.append(out)
            state.append((uniq[lo:hi], _local(order[first:last],
                                              first), _local(segments[lo:hi + 1], first), hi - lo))
        return outs, state

    def backward_apply(self, grads, offsets, state, step):
        """grads: per table (batch_t, dim) upstream gradients."""
        for table, grad, offset, (uniq, order, segments, u) in zip(self.tables, grads, offsets,
                                                                   state):
            grad_u = torch.empty((u, table.dim), device="cuda")
            sg.combine_backward(grad, order, segments, u, offset, grad_u)
            row_ids = table.find_or_insert_rows(
                uniq, torch.empty(max(u, 1), dtype=torch.int64, device="cuda"))
            identity = torch.arange(u + 1, dtype=torch.int64, device="cuda")
            table.backward_apply(self.optimizer,
                                 grad_u,
                                 identity,
                                 u,
                                 identity,
                                 identity,
                                 identity[u:],
                                 u,
                                 row_ids,
                                 step,
                                 max_key_entries=1,
                                 **self.hyperparameters)

    def __call__(self, keys, offsets, grads, step):
        outs, state = self.forward(keys, offsets)
        self.backward_apply(grads, offsets, state, step)
        return outs
