#!/usr/bin/env python3
"""Model-parallel sparse step over N GPUs, one process per GPU, NCCL
all-to-all between the stages (what Horovod does inside the TF graph):

  forward:  unique -> partition_by_owner -> all-to-all keys -> owner
            unique + find_or_insert (row ids) -> gather -> all-to-all values
            back -> combine
  backward: combine_backward -> all-to-all gradients to owners, by key
            range -> per-key sum fused with Adagrad, range by range

Weak scaling (T4): every GPU keeps its own batch and a table shard of
--rows-per-gpu keys; efficiency = t(1 GPU) / t(N GPUs).
--check: N-GPU outputs and trained rows equal a single-GPU run of the
global batch (rank 0 recomputes it with an unsharded table).

  python3 benchmarks/gpu/sparse_step.py --gpus 2 [--check]
"""
import argparse
import collections
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import fmt, time_ms
import sokev_gpu as sg

LR = 0.05


class Exchange:
    """all-to-all with per-destination counts. With 1 worker there is
    nothing to exchange: the data is used in place (no copy)."""

    def __init__(self, world):
        self.world = world

    def counts(self, send_counts):
        if self.world == 1:
            return send_counts
        recv = torch.empty_like(send_counts)
        dist.all_to_all_single(recv, send_counts)
        return recv

    def __call__(self, send, send_split, recv_split):
        if self.world == 1:
            return send
        recv = torch.empty((sum(recv_split),) + tuple(send.shape[1:]),
                           dtype=send.dtype,
                           device=send.device)
        dist.all_to_all_single(recv, send, recv_split, send_split)
        return recv


def _cuts(sorted_keys, splits, bounds):
    """For each segment of sorted_keys (lengths `splits`), the indices where
    each key range of `bounds` starts, plus its end: (segments, chunks + 1)."""
    rows, start = [], 0
    for n in splits:
        seg = sorted_keys[start:start + n]
        rows.append(
            torch.cat([
                torch.zeros(1, dtype=torch.int64, device=bounds.device),
                torch.searchsorted(seg, bounds),
                torch.tensor([n], device=bounds.device)
            ]) + start)
        start += n
    return torch.stack(rows) if rows else torch.empty((0, bounds.numel() + 1))


# What route_keys returns, in this order; names as in the steps below.
RoutedKeys = collections.namedtuple(
    "RoutedKeys", "world inverse u positions by_owner send_split recv_split owner_keys m ouniq "
    "oinverse oorder osegs onum ou orows ident")


def route_keys(table, exchange, keys):
    """The steps' common start: unique the batch's keys, send each to its
    owner (one all-to-all), and resolve the owner's unique keys to row ids
    (a key may come from several workers: one row lookup each).

    Returns RoutedKeys with: world; inverse (batch entry -> unique key); u
    unique keys; positions and by_owner from partition; send_split and
    recv_split (keys per peer); owner_keys, the m keys received, and ouniq; oinverse, oorder, osegs, onum
    from the owner's unique_segmented; ou owner unique keys; orows their row
    ids; ident = arange(m + 1), the offsets of one entry per received key."""
    world = exchange.world
    uniq, inverse, _, _, num = sg.unique_segmented(keys)
    u = int(num.item())
    by_owner, positions, counts = sg.partition(uniq[:u], world)
    send_split = counts.tolist()
    recv_split = exchange.counts(counts).tolist()
    owner_keys = exchange(by_owner, send_split, recv_split)
    m = owner_keys.numel()
    ouniq, oinverse, oorder, osegs, onum = sg.unique_segmented(owner_keys)
    ou = int(onum.item())
    orows = torch.empty(ou, dtype=torch.int64, device="cuda")
    table.find_or_insert(ouniq[:ou], row_ids=orows)
    ident = torch.arange(m + 1, device="cuda", dtype=torch.int64)
    return RoutedKeys(world, inverse, u, positions, by_owner, send_split, recv_split, owner_keys, m,
                      ouniq, oinverse, oorder, osegs, onum, ou, orows, ident)


def combine_returned_rows(back, positions, inverse, u, offsets, grad_out, dim):
    """Forward combine of the rows returned by the owners, and its backward.

    back holds the u unique keys' rows in by_owner order (positions maps that
    order to the unique keys), so entry j reads back[slot[inverse[j]]].
    Returns the (batch, dim) output and the per-unique gradients, already in
    by_owner (send) order."""
    slot = torch.empty(u, dtype=torch.int64, device="cuda")
    slot[positions] = torch.arange(u, device="cuda", dtype=torch.int64)
    index = slot[inverse]
    out = sg.combine_forward(back, index, offsets,
                             torch.empty((offsets.numel() - 1, dim), device="cuda"))
    # Entries grouped by their returned row, for the per-row gradient sums.
    order = torch.argsort(index, stable=True)
    segments = torch.cat([
        torch.zeros(1, dtype=torch.int64, device="cuda"),
        torch.bincount(index, minlength=u).cumsum(0)
    ])
    grad_sent = sg.combine_backward(grad_out, order, segments, u, offsets,
                                    torch.empty((u, dim), device="cuda"))
    return out, grad_sent


def sparse_step(table, exchange, keys, offsets, grad_out, step, dim, chunks=1):
    """One training step; returns the forward output (batch, dim).

    Each key is probed once (find_or_insert of the owner's unique keys gives
    row ids), sorted once per side (unique_segmented; its sort also yields
    the backward's segments), and the owner's gradient sum is fused with
    Adagrad (backward_apply). With chunks > 1 the backward gradient exchange
    is split by key range, so that the owner applies Adagrad to range c
    while range c + 1 is still in flight (same sums, same updates)."""
    (world, inverse, u, positions, by_owner, send_split, recv_split, owner_keys, m, ouniq, oinverse,
     oorder, osegs, onum, ou, orows, ident) = route_keys(table, exchange, keys)
    owner_values = table.lookup_combine_rows(orows, oinverse, ident,
                                             torch.empty((m, dim), device="cuda"))
    back = exchange(owner_values, recv_split, send_split)
    out, grad_sent = combine_returned_rows(back, positions, inverse, u, offsets, grad_out, dim)
    if world == 1 or chunks <= 1:
        owner_grads = exchange(grad_sent, send_split, recv_split)
        table.backward_apply("adagrad",
                             owner_grads,
                             ident,
                             m,
                             oorder,
                             osegs,
                             onum,
                             ou,
                             orows,
                             step,
                             lr=LR)
        return out
    # Key-range chunks: every segment is sorted by key (unique output is
    # ascending and partition is stable), so a range is contiguous in each.
    span = 1 << 64
    bounds = torch.tensor([-(1 << 63) + span * c // chunks for c in range(1, chunks)],
                          dtype=torch.int64,
                          device="cuda")
    send_cuts = _cuts(by_owner, send_split, bounds)
    recv_cuts = _cuts(owner_keys, recv_split, bounds)
    unique_cuts = torch.cat([
        torch.zeros(1, dtype=torch.int64, device="cuda"),
        torch.searchsorted(ouniq[:ou], bounds),
        torch.tensor([ou], device="cuda")
    ])
    chunk_counts = unique_cuts[1:] - unique_cuts[:-1]
    send_cuts, recv_cuts, ucuts = (send_cuts.tolist(), recv_cuts.tolist(), unique_cuts.tolist())
    owner_grads = torch.empty((m, dim), device="cuda")
    works = []
    for c in range(chunks):
        ins = [grad_sent[row[c]:row[c + 1]] for row in send_cuts]
        outs = [owner_grads[row[c]:row[c + 1]] for row in recv_cuts]
        works.append(dist.all_to_all(outs, ins, async_op=True))
    for c in range(chunks):
        works[c].wait()  # the compute stream waits for range c only
        a, b = ucuts[c], ucuts[c + 1]
        if b > a:
            table.backward_apply("adagrad",
                                 owner_grads,
                                 ident,
                                 m,
                                 oorder,
                                 osegs[a:],
                                 chunk_counts[c:c + 1],
                                 b - a,
                                 orows[a:],
                                 step,
                                 lr=LR)
    return out


def _segments(split):
    offs = [0]
    for n in split:
        offs.append(offs[-1] + n)
    return offs


def sparse_step_overlap(table, exchange, keys, offsets, grad_out, step, dim):
    """sparse_step with the big exchanges overlapped (world > 1; the same
    sums and updates, so the same results):
      forward:  the owner gathers the rows its peers asked for first and
                sends them (async, list all-to-all: no self segment through
                NCCL) while it gathers its own segment straight into `back`;
      backward: the gradients for peers go out async while the owner copies
                its own segment and applies Adagrad to the keys only it
                asked for; keys a peer asked for are applied after the wait.
    """
    (world, inverse, u, positions, by_owner, send_split, recv_split, owner_keys, m, ouniq, oinverse,
     oorder, osegs, onum, ou, orows, ident) = route_keys(table, exchange, keys)
    rank = dist.get_rank()
    soff, roff = _segments(send_split), _segments(recv_split)
    self_lo, self_hi = roff[rank], roff[rank + 1]
    # Owner keys a peer asked for (any entry outside the self segment) go
    # last: A = [0, n_self_only) can be updated before the gradients arrive.
    remote = ((oorder < self_lo) | (oorder >= self_hi)).to(torch.int64)
    cs = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), remote.cumsum(0)])
    segs = osegs[:ou + 1]
    has_remote = (cs[segs[1:]] - cs[segs[:-1]]) > 0
    perm = torch.argsort(has_remote.to(torch.int32), stable=True)
    lengths = (segs[1:] - segs[:-1])[perm]
    segs2 = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), lengths.cumsum(0)])
    seg_of = torch.repeat_interleave(torch.arange(ou, device="cuda"), lengths, output_size=m)
    pos = torch.arange(m, device="cuda") - segs2[seg_of]
    order2 = oorder[segs[perm[seg_of]] + pos]
    rows2 = orows[perm]
    n_a_dev = (~has_remote).sum().reshape(1)
    n_a = int(n_a_dev.item())
    n_b_dev = torch.tensor([ou - n_a], dtype=torch.int64, device="cuda")
    # forward: peers' rows first, sent async; own segment gathered in place.
    back = torch.empty((u, dim), device="cuda")
    sends, recvs = [], []
    for r in range(world):
        if r == rank:
            sends.append(back[:0])
            recvs.append(back[:0])
            continue
        n = roff[r + 1] - roff[r]
        buf = torch.empty((n, dim), device="cuda")
        if n:
            table.lookup_combine_rows(orows, oinverse[roff[r]:roff[r + 1]], ident[:n + 1], buf)
        sends.append(buf)
        recvs.append(back[soff[r]:soff[r + 1]])
    work = dist.all_to_all(recvs, sends, async_op=True)
    n_self = self_hi - self_lo
    if n_self:
        table.lookup_combine_rows(orows, oinverse[self_lo:self_hi], ident[:n_self + 1],
                                  back[soff[rank]:soff[rank + 1]])
    work.wait()
    out, grad_sent = combine_returned_rows(back, positions, inverse, u, offsets, grad_out, dim)
    owner_grads = torch.empty((m, dim), device="cuda")
    sends = [grad_sent[soff[r]:soff[r + 1]] if r != rank else grad_sent[:0] for r in range(world)]
    recvs = [
        owner_grads[roff[r]:roff[r + 1]] if r != rank else owner_grads[:0] for r in range(world)
    ]
    work = dist.all_to_all(recvs, sends, async_op=True)
    owner_grads[self_lo:self_hi].copy_(grad_sent[soff[rank]:soff[rank + 1]])
    if n_a:
        table.backward_apply("adagrad",
                             owner_grads,
                             ident,
                             m,
                             order2,
                             segs2,
                             n_a_dev,
                             n_a,
                             rows2,
                             step,
                             lr=LR)
    work.wait()
    if ou - n_a:
        table.backward_apply("adagrad",
                             owner_grads,
                             ident,
                             m,
                             order2,
                             segs2[n_a:],
                             n_b_dev,
                             ou - n_a,
                             rows2[n_a:],
                             step,
                             lr=LR)
    return out


def alltoall_bandwidth(rows, dim, reps=10):
    """NVLink floor: all_to_all_single of `rows` rows of dim floats to each
    peer (the self segment empty), alone. Returns (ms, GB/s sent per GPU)."""
    world = dist.get_world_size()
    rank = dist.get_rank()
    split = [rows if r != rank else 0 for r in range(world)]
    send = torch.randn((sum(split), dim), device="cuda")
    recv = torch.empty_like(send)
    t = time_ms(lambda _: dist.all_to_all_single(recv, send, split, split), [None],
                warmup=3,
                reps=reps)
    return t, send.numel() * 4 / (t[0] * 1e-3) / 1e9


def make_batch(gen, all_keys, batch, features, hot, dim):
    nnz = batch * features * hot
    idx = torch.randint(0, all_keys.numel(), (nnz,), generator=gen, device="cuda")
    offsets = torch.arange(0, nnz + 1, hot, device="cuda", dtype=torch.int64)
    grad = torch.randn((batch * features, dim), generator=gen, device="cuda")
    return all_keys[idx], offsets, grad


def new_table(dim, capacity):
    table = sg.HashTable(dim,
                         torch.int64,
                         init="uniform",
                         a=-0.05,
                         b=0.05,
                         seed=11,
                         capacity=capacity)
    table.add_slot("accumulator", 0.1)
    return table


def worker(rank, args, result_path):
    torch.cuda.set_device(rank)
    world = args.gpus
    if world > 1:
        kwargs = {}
        if args.overlap:
            # NCCL's kernels first when they compete with compute for SMs.
            options = dist.ProcessGroupNCCL.Options()
            options.is_high_priority_stream = True
            kwargs["pg_options"] = options
        try:
            dist.init_process_group("nccl",
                                    init_method=f"tcp://127.0.0.1:{args.port}",
                                    rank=rank,
                                    world_size=world,
                                    **kwargs)
        except TypeError:  # no pg_options in this torch: default priority
            dist.init_process_group("nccl",
                                    init_method=f"tcp://127.0.0.1:{args.port}",
                                    rank=rank,
                                    world_size=world)
    exchange = Exchange(world)
    dim = args.dim

    def step_fn(tbl, ex, k, o, g, st, d, chunks=1):
        if args.overlap and ex.world > 1:
            return sparse_step_overlap(tbl, ex, k, o, g, st, d)
        return sparse_step(tbl, ex, k, o, g, st, d, chunks)

    # Every rank builds the same global key set, then inserts its own shard.
    gen = torch.Generator(device="cuda").manual_seed(5)
    total_rows = args.rows_per_gpu * world
    all_keys = torch.randint(-(1 << 62),
                             1 << 62, (total_rows,),
                             generator=gen,
                             device="cuda",
                             dtype=torch.int64)
    mine_keys, _, counts = sg.partition(all_keys, world)
    start = int(counts[:rank].sum().item())
    mine = mine_keys[start:start + int(counts[rank].item())]
    table = new_table(dim, int(mine.numel() * 1.3))
    for s in range(0, mine.numel(), 1 << 22):
        table.find_or_insert(mine[s:s + (1 << 22)])
    batch_gen = torch.Generator(device="cuda").manual_seed(100 + rank)
    result = {}
    if args.check:
        batches = [
            make_batch(batch_gen, all_keys, args.check_batch, args.features, args.hot, dim)
            for _ in range(3)
        ]
        outs = [
            step_fn(table, exchange, k, o, g, step + 1, dim, args.chunks)
            for step, (k, o, g) in enumerate(batches)
        ]
        probe = all_keys[:20000]
        found = torch.zeros(probe.numel(), dtype=torch.bool, device="cuda")
        vals = torch.zeros((probe.numel(), dim), device="cuda")
        table.find(probe, vals, found)
        if world > 1:
            gathered = [[torch.empty_like(o) for _ in range(world)] for o in outs]
            for g, o in zip(gathered, outs):
                dist.all_gather(g, o)
            dist.all_reduce(vals)  # each key lives on exactly one rank
            keys_all = [[torch.empty_like(b[0]) for _ in range(world)] for b in batches]
            grads_all = [[torch.empty_like(b[2]) for _ in range(world)] for b in batches]
            for i, b in enumerate(batches):
                dist.all_gather(keys_all[i], b[0])
                dist.all_gather(grads_all[i], b[2])
        else:
            gathered = [[o] for o in outs]
            keys_all = [[b[0]] for b in batches]
            grads_all = [[b[2]] for b in batches]
        if rank == 0:
            # Single GPU, unsharded table, the global batch.
            ref_table = new_table(dim, int(total_rows * 1.3))
            for s in range(0, total_rows, 1 << 22):
                ref_table.find_or_insert(all_keys[s:s + (1 << 22)])
            one = Exchange(1)
            err = 0.0
            for i in range(len(batches)):
                k = torch.cat(keys_all[i])
                g = torch.cat(grads_all[i])
                hot = args.hot
                o = torch.arange(0, k.numel() + 1, hot, device="cuda", dtype=torch.int64)
                ref_out = sparse_step(ref_table, one, k, o, g, i + 1, dim)
                got = torch.cat(gathered[i])
                err = max(err, ((got - ref_out).norm() / ref_out.norm()).item())
            ref_vals = torch.zeros_like(vals)
            ref_table.find(probe, ref_vals)
            verr = ((vals - ref_vals).norm() / ref_vals.norm()).item()
            result["check"] = dict(forward_rel_err=err,
                                   table_rel_err=verr,
                                   passed=err < 1e-5 and verr < 1e-5)
            print(
                f"[check gpus={world}] forward rel err {err:.2e}, trained rows "
                f"rel err {verr:.2e} -> {'PASS' if result['check']['passed'] else 'FAIL'}",
                flush=True)
    else:
        sets = [
            make_batch(batch_gen, all_keys, args.batch, args.features, args.hot, dim)
            for _ in range(3)
        ]
        state = dict(step=0)

        def run(s):
            state["step"] += 1
            step_fn(table, exchange, s[0], s[1], s[2], state["step"], dim, args.chunks)

        if world > 1:
            dist.barrier()
        t = time_ms(run, sets, warmup=3, reps=args.reps)
        a2a = None
        if world > 1:
            # rows sent to each peer per step: this batch's unique keys / world
            u = sg.unique_segmented(sets[0][0])[4].item()
            a2a = alltoall_bandwidth(int(u) // world, dim)
        times = [None] * world
        if world > 1:
            all_t = [None] * world
            dist.all_gather_object(all_t, t)
            times = all_t
        else:
            times = [t]
        if rank == 0:
            slowest = max(x[0] for x in times)
            result["step_ms"] = slowest
            result["per_rank"] = [fmt(x) for x in times]
            print(
                f"[gpus={world}] sparse step (batch {args.batch}/GPU, {args.features} "
                f"features, {args.hot}-hot, dim {dim}, {args.rows_per_gpu} keys/GPU): "
                f"{slowest:.3f} ms  per rank {result['per_rank']}"
                f"{'  (overlap)' if args.overlap and world > 1 else ''}",
                flush=True)
            if a2a is not None:
                result["alltoall_alone"] = dict(time=fmt(a2a[0]), GBps=a2a[1])
                print(
                    f"[gpus={world}] all-to-all alone, {int(u) // world} rows x {dim} "
                    f"floats to each peer: {fmt(a2a[0])}, {a2a[1]:.0f} GB/s sent per GPU "
                    f"(one exchange; the step has two)",
                    flush=True)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(result, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--features", type=int, default=26)
    parser.add_argument("--hot", type=int, default=1)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--rows-per-gpu", type=int, default=10_000_000)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--chunks",
                        type=int,
                        default=1,
                        help="key-range chunks of the pipelined gradient exchange "
                        "(4 measured slower than 1 on 2x H200: NOTES.md)")
    parser.add_argument("--overlap",
                        action="store_true",
                        help="sparse_step_overlap for N > 1 GPUs (1 GPU: the plain step)")
    parser.add_argument("--check-batch", type=int, default=4096)
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--scaling",
                        action="store_true",
                        help="time 1 GPU and --gpus GPUs, print the efficiency")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    out_dir = os.environ.get("OUT", ".")
    counts = [1, args.gpus] if args.scaling else [args.gpus]
    results = {}
    for n in counts:
        args_n = argparse.Namespace(**{**vars(args), "gpus": n})
        path = os.path.join(out_dir, f"sparse_step_{n}{'_check' if args.check else ''}.json")
        if n == 1:
            worker(0, args_n, path)
        else:
            mp.spawn(worker, args=(args_n, path), nprocs=n, join=True)
        with open(path) as f:
            results[n] = json.load(f)
    if args.scaling and not args.check:
        t1, tn = results[1]["step_ms"], results[args.gpus]["step_ms"]
        print(
            f"T4 weak scaling 1 -> {args.gpus} GPUs: {t1:.3f} -> {tn:.3f} ms, "
            f"efficiency {100 * t1 / tn:.1f}% (target 90%)",
            flush=True)


if __name__ == "__main__":
    main()
