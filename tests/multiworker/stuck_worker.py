"""One rank of test_failures.py: a worker that dies or hangs.

  python stuck_worker.py --out DIR --fault die|hang

Rank 1 exits with status 3 (die) or sleeps for an hour (hang) instead of
taking part in the lookup; the other ranks wait for it in the exchange.
"""
import argparse
import os
import time

import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
import sok_ev  # pylint: disable=wrong-import-position

sok_ev.init()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fault", choices=["die", "hang"], required=True)
    args = parser.parse_args()
    if hvd.rank() == 1:
        if args.fault == "die":
            os._exit(3)  # pylint: disable=protected-access
        time.sleep(3600)
    table = sok_ev.get_embedding_variable("t", embedding_dim=4)
    ids = tf.SparseTensor([[0, 0]], tf.constant([7], tf.int64), [1, 1])
    sok_ev.lookup_sparse([table], [ids])


if __name__ == "__main__":
    main()
