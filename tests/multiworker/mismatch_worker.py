"""One rank of test_failures.py: workers that disagree on their tables.

  python mismatch_worker.py --out DIR

Rank 1 builds table "t1" with embedding_dim 8 where the others use 4 (graph
mode), then "t2" with target_gpu 0 where the others use -1 (eager), then a
lookup of "t3" with exchange_dtype bfloat16 where the others use float16
(eager), and, on GPUs, a lookup of "t4" with SOK_EV_ROW_TRANSPORT=nccl where
the others use Horovod (eager; on CPU workers the transport is refused before
the check). Each rank records the ValueError message of each lookup ("" if
none).
"""
import argparse
import os

import tensorflow as tf
import horovod.tensorflow as hvd

import harness

hvd.init()
import sok_ev  # pylint: disable=wrong-import-position

sok_ev.init()
RANK = hvd.rank()


def lookup(name, dim, target_gpu, exchange_dtype=tf.float32):
    table = sok_ev.get_embedding_variable(name, embedding_dim=dim, target_gpu=target_gpu)
    ids = tf.SparseTensor([[0, 0]], tf.constant([RANK], tf.int64), [1, 1])
    return sok_ev.lookup_sparse([table], [ids], exchange_dtype=exchange_dtype)


def message_of(build):
    try:
        build()
    except ValueError as error:
        return str(error)
    return ""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = {}
    with tf.Graph().as_default():
        results["dim"] = message_of(lambda: lookup("t1", 8 if RANK == 1 else 4, -1))
    results["target_gpu"] = message_of(lambda: lookup("t2", 4, 0 if RANK == 1 else -1))
    results["exchange_dtype"] = message_of(lambda: lookup("t3", 4, -1, "bfloat16"
                                                          if RANK == 1 else "float16"))
    if tf.config.list_physical_devices("GPU"):
        os.environ["SOK_EV_ROW_TRANSPORT"] = "nccl" if RANK == 1 else "horovod"
        results["row_transport"] = message_of(lambda: lookup("t4", 4, -1))
        del os.environ["SOK_EV_ROW_TRANSPORT"]
    harness.save_rank_results(args.out, RANK, results)


if __name__ == "__main__":
    main()
