#!/usr/bin/env python3
"""Diagnostic for T3's fused backward+Adagrad stage: times backward_apply
alone on the T3 shape (10M keys, 1.56M unique a step, dim 128, Adagrad)
against its byte floor; with --ncu runs one launch for Nsight Compute:
  ncu --clock-control none -k regex:backward_apply --section SpeedOfLight \
      --section Occupancy python3 backward_probe.py --ncu

  python3 benchmarks/gpu/backward_probe.py [--ncu]
"""
import argparse

import torch

from common import time_ms
from bench_core import make_table


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ncu", action="store_true")
    parser.add_argument("--rows", type=int, default=10_000_000)
    args = parser.parse_args()
    import sokev_gpu as sg
    gen = torch.Generator(device="cuda").manual_seed(1)
    table, keys = make_table(args.rows, 128, gen)
    table.add_slot("accumulator", 0.1)
    nnz = 65536 * 26
    offsets = torch.arange(0, nnz + 1, device="cuda", dtype=torch.int64)
    pre = []
    for _ in range(3):
        k = keys[torch.randint(0, args.rows, (nnz,), device="cuda")]
        g = torch.randn((nnz, 128), device="cuda")
        uq, inv, order, segs, num = sg.unique_segmented(k)
        u = int(num.item())
        ids = torch.empty(u, dtype=torch.int64, device="cuda")
        table.find_or_insert(uq[:u], row_ids=ids)
        pre.append((g, order, segs, num, u, ids))

    def run(p):
        table.backward_apply("adagrad",
                             p[0],
                             offsets,
                             nnz,
                             p[1],
                             p[2],
                             p[3],
                             p[4],
                             p[5],
                             1000,
                             lr=0.01)

    if args.ncu:
        run(pre[0])
        torch.cuda.synchronize()
    else:
        t = time_ms(run, pre, reps=20)
        print(f"backward_apply: {t[0]:.3f} ms [{t[1]:.3f}, {t[2]:.3f}]", flush=True)
    # Bytes: rows read + written (value + accumulator), gradient rows read.
    u = pre[0][4]
    print(
        f"unique keys {u}, floor bytes {u * (2 * 1024 + 512) / 1e9:.2f} GB "
        f"-> {u * (2 * 1024 + 512) / 4.23e12 * 1e3:.3f} ms at 4.23 TB/s",
        flush=True)


if __name__ == "__main__":
    main()
