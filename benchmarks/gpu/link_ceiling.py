#!/usr/bin/env python3
"""The ceiling of the rows' exchange between two GPUs of one host, without
TensorFlow: what NCCL itself and the copy engines reach on the same link.

sok-ev's row exchange (cc/nccl_exchange_gpu.cu) is one grouped
ncclSend/ncclRecv per peer of uint8 buffers; Horovod's is NCCL's all-to-all.
For a sweep of message sizes (bytes each GPU sends the other), one PyTorch
process per GPU (NCCL backend, no kit paths) times, with CUDA events, the
median of --reps after warm-up:

  send_recv      torch.distributed.batch_isend_irecv of one send and one
                 receive per rank (the exchange's own NCCL calls);
  all_to_all     torch.distributed.all_to_all_single over both ranks, half
                 of each rank's buffer staying local (Horovod's operation);
  peer_copy      cudaMemcpyPeerAsync by the copy engines (Tensor.copy_ between
                 the GPUs), both directions at once, from rank 0's process
                 (the link without NCCL).

GB/s count the bytes that cross the link in one direction per unit time (each
direction carries the same). The table is printed, written to
$OUT/link_ceiling.md (--out) and appended to benchmarks/RESULTS.md (--results).

  python3 benchmarks/gpu/link_ceiling.py [--sizes-mb 16,64,256,512] [--reps 20]
"""
import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from results import publish  # pylint: disable=wrong-import-position

RESULTS = os.path.join(os.path.dirname(HERE), "RESULTS.md")


def timed_ms(fn, warmup, reps):
    """Median ms of fn() over `reps` runs, CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rank_main(rank, args, port, queue):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl",
                            init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank,
                            world_size=2,
                            device_id=torch.device("cuda", rank))
    peer = 1 - rank
    rows = {}
    for mb in [int(s) for s in args.sizes_mb.split(",")]:
        n = mb << 20
        send = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
        recv = torch.empty_like(send)

        def send_recv():
            for request in dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, send, peer),
                 dist.P2POp(dist.irecv, recv, peer)]):
                request.wait()

        both = torch.cat([send, send])
        both_out = torch.empty_like(both)
        ms_send_recv = timed_ms(send_recv, 3, args.reps)
        ms_all_to_all = timed_ms(lambda: dist.all_to_all_single(both_out, both), 3, args.reps)
        # What arrived is checked against the peer's sum of what it sent.
        checksum = int(recv.sum(dtype=torch.int64))
        dist.barrier()
        rows[mb] = (ms_send_recv, ms_all_to_all, checksum, int(send.sum(dtype=torch.int64)))
        del send, recv, both, both_out
    dist.destroy_process_group()
    queue.put((rank, rows))


def peer_copy_ms(n, reps):
    """Both directions at once by the copy engines: rank 0's process drives
  two streams."""
    a0 = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda:0")
    a1 = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda:1")
    b0, b1 = torch.empty_like(a0), torch.empty_like(a1)
    s0, s1 = torch.cuda.Stream(device=0), torch.cuda.Stream(device=1)

    def copy():
        with torch.cuda.stream(s0):
            b1.copy_(a0, non_blocking=True)  # 0 -> 1, queued on GPU 0
        with torch.cuda.stream(s1):
            b0.copy_(a1, non_blocking=True)  # 1 -> 0, queued on GPU 1
        s0.synchronize()
        s1.synchronize()

    for _ in range(3):
        copy()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        copy()
        times.append((time.perf_counter() - start) * 1e3)
    assert torch.equal(b1.cpu(), a0.cpu()) and torch.equal(b0.cpu(), a1.cpu())
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="16,64,256,512")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--port", type=int, default=29561)
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        sys.exit(f"link_ceiling.py needs 2 GPUs, found {torch.cuda.device_count()}")
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [
        context.Process(target=rank_main, args=(r, args, args.port, queue)) for r in range(2)
    ]
    for p in processes:
        p.start()
    by_rank = dict(queue.get(timeout=300) for _ in processes)
    for p in processes:
        p.join(60)
        if p.exitcode != 0:
            sys.exit(f"rank process exited with {p.exitcode}")
    lines = [
        f"\n## Link ceiling between 2 GPUs, without TensorFlow, {datetime.date.today()}", "",
        f"{torch.cuda.get_device_name(0)} x2, PyTorch {torch.__version__}, NCCL "
        f"{'.'.join(map(str, torch.cuda.nccl.version()))}. Command: `python3 "
        f"benchmarks/gpu/link_ceiling.py --sizes-mb {args.sizes_mb} --reps {args.reps}`. "
        "MB: bytes each GPU sends the other; GB/s: those bytes ÷ the slower rank's median time "
        "(one direction; both directions carry as much at once).", "",
        "| MB each way | NCCL send/recv ms | GB/s | NCCL all_to_all_single ms | GB/s | "
        "copy engines, both ways, ms | GB/s |", "|---|---|---|---|---|---|---|"
    ]
    for mb in [int(s) for s in args.sizes_mb.split(",")]:
        send_recv = max(by_rank[r][mb][0] for r in range(2))
        all_to_all = max(by_rank[r][mb][1] for r in range(2))
        # Each rank received what the other sent (sums of the same bytes).
        if by_rank[0][mb][2] != by_rank[1][mb][3] or by_rank[1][mb][2] != by_rank[0][mb][3]:
            sys.exit(f"{mb} MB: the received bytes differ from the sent ones")
        copy = peer_copy_ms(mb << 20, args.reps)
        rate = lambda ms, b=mb << 20: f"{b / (ms * 1e-3) / 1e9:.1f}"
        lines.append(f"| {mb} | {send_recv:.3f} | {rate(send_recv)} | {all_to_all:.3f} | "
                     f"{rate(all_to_all)} | {copy:.3f} | {rate(copy)} |")
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    publish(text, args.results, os.path.join(args.out, "link_ceiling.md"), "tf-weak-scaling")


if __name__ == "__main__":
    main()
