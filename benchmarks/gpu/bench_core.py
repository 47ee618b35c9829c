#!/usr/bin/env python3
"""T1 (forward lookup), T2 (hash table throughput), T3 (full sparse step)
and T5 (memory per key) on one GPU, each against its baseline measured in
the same run. T1 and T3 run the stages exactly as the TensorFlow kernels do
(core_step.py). Criteo shape by default: batch 65536, 26 features (one
grouped table, SOK style), dim 128, 10M keys filled.

  python3 benchmarks/gpu/bench_core.py [--only T1,T2,T3,T5] [--rows N]
"""
import argparse
import json
import os

import torch

from common import copy_bandwidth, fmt, time_ms
from core_step import CoreSparseStep
import sokev_gpu as sg


def make_table(rows, dim, key_gen, max_load=0.75):
    """A table holding `rows` random int64 keys; returns (table, keys)."""
    keys = torch.randint(-(1 << 62),
                         1 << 62, (rows,),
                         generator=key_gen,
                         device="cuda",
                         dtype=torch.int64)
    table = sg.HashTable(dim,
                         torch.int64,
                         init="uniform",
                         a=-0.05,
                         b=0.05,
                         seed=7,
                         capacity=rows,
                         max_load_factor=max_load)
    for start in range(0, rows, 1 << 22):
        table.find_or_insert(keys[start:start + (1 << 22)])
    torch.cuda.synchronize()
    return table, keys


def bench_t1(args, bw, results, table, keys):
    """The forward of FindOrInsertCombine's path: unique, find_or_insert,
    gather + combine from the rows (no unique-values matrix)."""
    dim, batch, feats = args.dim, args.batch, args.features
    rows = keys.numel()
    weight = torch.empty((rows, dim), device="cuda")
    # The same rows as the table: export order is arbitrary, so read them.
    table.find(keys, weight)
    step = CoreSparseStep([table])
    for hot in (1, 10):
        nnz = batch * feats * hot
        bags = batch * feats
        sets = []
        for _ in range(3):
            idx = torch.randint(0, rows, (nnz,), device="cuda")
            sets.append((idx, keys[idx]))
        offsets = torch.arange(0, nnz + 1, hot, device="cuda", dtype=torch.int64)
        ours = time_ms(lambda s: step.forward([s[1]], [offsets]), sets)
        out = step.forward([sets[0][1]], [offsets])[0][0]
        ref = sg.combine_forward(weight, sets[0][0], offsets, torch.empty_like(out))
        err = (out - ref).abs().max().item()
        bag = time_ms(
            lambda s: torch.nn.functional.embedding_bag(s[0], weight, offsets[:-1], mode="sum"),
            sets)
        emb = time_ms(
            lambda s: torch.nn.functional.embedding(s[0], weight).view(bags, hot, dim).sum(1), sets)
        baseline = min(bag[0], emb[0])
        floor_bytes = nnz * (dim * 4 + 8) + bags * dim * 4
        floor_ms = floor_bytes / bw * 1e3
        r = dict(hot=hot,
                 ours_ms=ours[0],
                 ours=fmt(ours),
                 embedding_bag=fmt(bag),
                 embedding_sum=fmt(emb),
                 speedup=baseline / ours[0],
                 floor_ms=floor_ms,
                 fraction_of_floor=floor_ms / ours[0],
                 achieved_GBps=floor_bytes / ours[0] / 1e6,
                 max_abs_err=err)
        results[f"T1_{hot}hot"] = r
        print(
            f"T1 {hot}-hot (unique + find_or_insert + gather/combine): ours {fmt(ours)}  "
            f"embedding_bag {fmt(bag)}  embedding+sum {fmt(emb)}  speedup "
            f"{r['speedup']:.2f}x  floor {floor_ms:.3f} ms -> "
            f"{100 * r['fraction_of_floor']:.0f}%  err {err:.1e}",
            flush=True)
    del weight


def bench_t2(args, bw, results):
    slots = 1 << 26  # 64M slots, as HierarchicalKV's benchmark
    dim = 8
    gen = torch.Generator(device="cuda").manual_seed(3)

    def new_table():
        # Sized for the highest load factor measured; the table never grows.
        return sg.HashTable(dim,
                            torch.int64,
                            init="constant",
                            a=0.5,
                            capacity=int(slots * 0.95),
                            max_load_factor=0.95)

    table = new_table()
    info = table.info()
    assert info["buckets"] * 16 == slots, info
    stored = torch.empty(0, dtype=torch.int64, device="cuda")
    n = 1 << 20
    for load in (0.5, 0.75, 0.93):
        want = int(load * slots) - stored.numel()
        fresh = torch.randint(-(1 << 62),
                              1 << 62, (want,),
                              generator=gen,
                              device="cuda",
                              dtype=torch.int64)
        for start in range(0, want, 1 << 22):
            table.find_or_insert(fresh[start:start + (1 << 22)])
        stored = torch.cat([stored, fresh])
        size = table.size()
        sets = [
            stored[torch.randint(0, stored.numel(), (n,), generator=gen, device="cuda")]
            for _ in range(4)
        ]
        values = torch.empty((n, dim), device="cuda")
        find = time_ms(lambda k: table.find(k, values), sets, reps=30)
        foi = time_ms(lambda k: table.find_or_insert(k, values), sets, reps=30)
        # Same number of bytes moved by a copy: 1M * (8 key + 32 value + 32 out)
        r = dict(load_factor=size / slots,
                 find_Gkeys=n / find[0] / 1e6,
                 find_or_insert_Gkeys=n / foi[0] / 1e6,
                 find=fmt(find),
                 find_or_insert=fmt(foi))
        results[f"T2_lf{load}"] = r
        print(
            f"T2 lf {size / slots:.3f}: find {r['find_Gkeys']:.2f} G keys/s "
            f"(target 6), find_or_insert {r['find_or_insert_Gkeys']:.2f} "
            f"G keys/s (target 3.5)  [{fmt(find)} / {fmt(foi)}]",
            flush=True)
    assert table.size() == stored.unique().numel()
    # All-new keys: find_or_insert that inserts (1M keys into a 0.5 table).
    del table
    table = new_table()
    fresh = torch.randint(-(1 << 62),
                          1 << 62, (32 * n,),
                          generator=gen,
                          device="cuda",
                          dtype=torch.int64)
    sets = [fresh[i * n:(i + 1) * n] for i in range(32)]
    values = torch.empty((n, dim), device="cuda")
    ins = time_ms(lambda k: table.find_or_insert(k, values), sets, warmup=2, reps=30)
    results["T2_insert_new"] = dict(Gkeys=n / ins[0] / 1e6, time=fmt(ins))
    print(f"T2 inserting new keys (lf 0 -> 0.5): {n / ins[0] / 1e6:.2f} G keys/s", flush=True)


def bench_t3(args, bw, results, table, keys):
    """Full sparse step, forward + backward + Adagrad, 26 features one-hot,
    as the TensorFlow kernels run it, against torch."""
    dim, batch, feats = args.dim, args.batch, args.features
    rows = keys.numel()
    nnz = batch * feats
    offsets = torch.arange(0, nnz + 1, device="cuda", dtype=torch.int64)
    sets = []
    for _ in range(3):
        idx = torch.randint(0, rows, (nnz,), device="cuda")
        sets.append((idx, keys[idx], torch.randn((nnz, dim), device="cuda")))
    core = CoreSparseStep([table], "adagrad", lr=0.01)
    state = dict(step=0)

    def ours(s):
        state["step"] += 1
        core([s[1]], [offsets], [s[2]], state["step"])

    t_ours = time_ms(ours, sets, reps=10)
    # Stage breakdown (each stage timed alone on the same inputs).
    pre = [(k, g, core.forward([k], [offsets])[1]) for _, k, g in sets]
    stages = dict(forward=time_ms(lambda p: core.forward([p[0]], [offsets]), pre, reps=10),
                  backward_adagrad=time_ms(
                      lambda p: core.backward_apply([p[1]], [offsets], p[2], 1000), pre, reps=10))
    print("T3 stages: " + ", ".join(f"{k} {v[0]:.3f} ms" for k, v in stages.items()), flush=True)
    results["T3_stages_ms"] = {k: v[0] for k, v in stages.items()}
    emb = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True).cuda()
    opt = torch.optim.Adagrad(emb.parameters(), lr=0.01)

    def torch_step(s):
        idx, _, grad_out = s
        o = emb(idx, offsets[:-1])
        o.backward(grad_out)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t_torch = time_ms(torch_step, sets, reps=10)
    r = dict(ours=fmt(t_ours), torch=fmt(t_torch), speedup=t_torch[0] / t_ours[0])
    results["T3"] = r
    print(
        f"T3 sparse step: ours {fmt(t_ours)}  torch EmbeddingBag(sparse)+Adagrad "
        f"{fmt(t_torch)}  speedup {r['speedup']:.2f}x (target 3x)",
        flush=True)
    del emb, opt


def bench_t5(args, results, table, keys):
    info = table.info()
    size = table.size()
    raw = 8 + info["row_width"] * 4
    per_key = info["memory_bytes"] / size
    results["T5"] = dict(bytes_per_key=per_key, raw=raw, ratio=per_key / raw, **info)
    print(
        f"T5 memory: {per_key:.0f} B/key for {size} keys, raw key+value+slots "
        f"{raw} B -> {per_key / raw:.3f}x (target <= 1.3x)",
        flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="T1,T2,T3,T5")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--features", type=int, default=26)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--json",
                        default=os.path.join(os.environ.get("OUT", "."), "bench_core.json"))
    args = parser.parse_args()
    only = args.only.split(",")
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    bw = copy_bandwidth()
    print(f"D2D copy bandwidth: {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    results = dict(device=torch.cuda.get_device_name(), copy_TBps=bw / 1e12)
    if "T2" in only:
        bench_t2(args, bw, results)
        torch.cuda.empty_cache()
    if any(t in only for t in ("T1", "T3", "T5")):
        gen = torch.Generator(device="cuda").manual_seed(1)
        table, keys = make_table(args.rows, args.dim, gen)
        if "T1" in only:
            bench_t1(args, bw, results, table, keys)
        table.add_slot("accumulator", 0.1)  # Adagrad's slot, as T3 trains
        if "T5" in only:
            bench_t5(args, results, table, keys)
        if "T3" in only:
            bench_t3(args, bw, results, table, keys)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
