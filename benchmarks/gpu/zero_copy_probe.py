"""How fast a GPU kernel reads and writes rows in pinned host memory in
place (zero-copy), against a copy engine's bulk copy and a host-thread
gather, on the rows a host tier moves (cc/host_tier.h).

Needs CuPy and PyTorch with a GPU, no sok-ev. Rows are 1,040-byte records
(dim 128 plus an Adagrad slot, and a 16-byte header), --rows of them moved
each way from a host pool of --pool-gib, in chunks of --chunk-mib (the host
tier's largest chunk is 8 MiB). It prints one line per case: GB/s and ms.

  python benchmarks/gpu/zero_copy_probe.py [--pool-gib 8] [--rows 500000]
"""
import argparse
import time

import cupy
import numpy as np
import torch

RECORD_BYTES, ROW_FLOATS = 1040, 256

_KERNELS = cupy.RawModule(code=r"""
extern "C" __global__ void gather(const unsigned long long* records, long long n, float* out) {
  const int lane = threadIdx.x & 31;
  for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; i < n;
       i += ((long long)gridDim.x * blockDim.x) >> 5) {
    const float4* from = (const float4*)(records[i] + 16);
    float4* to = (float4*)(out + i * 256);
    for (int c = lane; c < 64; c += 32) to[c] = from[c];
  }
}
extern "C" __global__ void scatter(const float* rows, long long n,
                                   const unsigned long long* records) {
  const int lane = threadIdx.x & 31;
  for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; i < n;
       i += ((long long)gridDim.x * blockDim.x) >> 5) {
    float4* to = (float4*)(records[i] + 16);
    const float4* from = (const float4*)(rows + i * 256);
    for (int c = lane; c < 64; c += 32) to[c] = from[c];
  }
}
""")


def _timed(run, repeats=3):
    times = []
    for _ in range(repeats):
        cupy.cuda.runtime.deviceSynchronize()
        start = time.perf_counter()
        run()
        cupy.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def _pool(pool_bytes, chunk_bytes):
    """Pinned, mapped chunks (cudaHostAllocPortable | Mapped); their bases."""
    chunks = []
    for _ in range(pool_bytes // chunk_bytes):
        chunks.append(cupy.cuda.runtime.hostAlloc(chunk_bytes, 1 | 2))
    return chunks


def _record_addresses(chunks, chunk_bytes, rows, order, rng):
    per_chunk = chunk_bytes // RECORD_BYTES
    slots = rng.choice(len(chunks) * per_chunk, rows, replace=False)
    if order == "sorted":
        slots = np.sort(slots)
    elif order == "sequential":
        slots = np.arange(rows)
    bases = np.array(chunks, np.uint64)
    return bases[slots // per_chunk] + (slots % per_chunk).astype(np.uint64) * RECORD_BYTES


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-gib", type=float, default=8)
    parser.add_argument("--rows", type=int, default=500000)
    parser.add_argument("--chunk-mib", default="8,1024")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    moved = args.rows * ROW_FLOATS * 4
    rows = cupy.empty((args.rows, ROW_FLOATS), cupy.float32)
    gather, scatter = _KERNELS.get_function("gather"), _KERNELS.get_function("scatter")
    blocks, threads = (args.rows * 32 + 255) // 256, 256

    def report(case, seconds):
        print(f"{case:60s} {moved / seconds / 1e9:6.1f} GB/s {seconds * 1e3:7.2f} ms", flush=True)

    staging = cupy.cuda.alloc_pinned_memory(moved)
    report("copy engine, pinned -> GPU, one block",
           _timed(lambda: cupy.cuda.runtime.memcpy(rows.data.ptr, staging.ptr, moved, 1)))
    report("copy engine, GPU -> pinned, one block",
           _timed(lambda: cupy.cuda.runtime.memcpy(staging.ptr, rows.data.ptr, moved, 2)))
    for chunk_mib in (int(c) for c in args.chunk_mib.split(",")):
        chunk_bytes = chunk_mib << 20
        start = time.perf_counter()
        chunks = _pool(int(args.pool_gib * (1 << 30)), chunk_bytes)
        pinned_s = time.perf_counter() - start
        print(f"pinned {args.pool_gib} GiB in {chunk_mib} MiB chunks: {pinned_s:.1f} s", flush=True)
        for order in ("sequential", "sorted", "random"):
            addresses = cupy.asarray(_record_addresses(chunks, chunk_bytes, args.rows, order, rng))
            report(
                f"kernel gather, {order} records, {chunk_mib} MiB chunks",
                _timed(lambda a=addresses: gather((blocks,), (threads,),
                                                  (a, np.int64(args.rows), rows))))
            report(
                f"kernel scatter, {order} records, {chunk_mib} MiB chunks",
                _timed(lambda a=addresses: scatter((blocks,), (threads,),
                                                   (rows, np.int64(args.rows), a))))
        # As the host tier moves them: one launch a table (26 tables).
        part = args.rows // 26
        addresses = cupy.asarray(_record_addresses(chunks, chunk_bytes, part * 26, "random", rng))

        def per_table():
            for t in range(26):
                gather(((part * 32 + 255) // 256,), (threads,),
                       (addresses[t * part:], np.int64(part), rows[t * part:]))

        report(f"kernel gather, random records, 26 launches, {chunk_mib} MiB chunks",
               _timed(per_table))
        # The record addresses themselves in pinned host memory (each warp
        # reads its row's address over the link first).
        host_addresses = cupy.cuda.alloc_pinned_memory(args.rows * 8)
        np.frombuffer(host_addresses, np.uint64,
                      args.rows)[:] = _record_addresses(chunks, chunk_bytes, args.rows, "random",
                                                        rng)
        in_host = np.uint64(host_addresses.ptr)
        report(f"kernel gather, random records, addresses in host memory, {chunk_mib} MiB",
               _timed(lambda: gather((blocks,), (threads,), (in_host, np.int64(args.rows), rows))))
        report(f"kernel scatter, random records, addresses in host memory, {chunk_mib} MiB",
               _timed(lambda: scatter((blocks,), (threads,), (rows, np.int64(args.rows), in_host))))
        for chunk in chunks:
            cupy.cuda.runtime.freeHost(chunk)
    # Host threads gathering the same random rows into a pinned block, then
    # one bulk copy: the other way to move them.
    torch.set_num_threads(16)
    pool = torch.empty((int(args.pool_gib * (1 << 30)) // RECORD_BYTES, ROW_FLOATS + 4))
    pool.fill_(1.0)
    index = torch.from_numpy(rng.choice(pool.shape[0], args.rows, replace=False))
    out = torch.empty((args.rows, ROW_FLOATS + 4)).pin_memory()
    report("host gather (torch, 16 threads), random rows -> pinned",
           _timed(lambda: torch.index_select(pool, 0, index, out=out)))
    report("host scatter (torch, 16 threads), pinned -> random rows",
           _timed(lambda: pool.index_copy_(0, index, out)))


if __name__ == "__main__":
    main()
