"""One rank of test_failures.py: a worker that dies or hangs.

  python stuck_worker.py --out DIR --fault die|hang|hang-between-exchanges

die, hang: rank 1 exits with status 3 (die) or sleeps for an hour (hang)
instead of taking part in the lookup; the other ranks wait for it in the
exchange.

hang-between-exchanges (GPU workers, SOK_EV_ROW_TRANSPORT=nccl): every rank
runs one graph-mode lookup step (which makes the lookup's NCCL
communicator); then rank 1 runs the step's key exchange only (its
UnpackKeyMessage) and sleeps for an hour, so rank 0's row exchange has no
partner. Rank 0 prints "[rank 0] failed: <error>" and exits with status 4
when its step fails.
"""
import argparse
import os
import time

import harness  # noqa: F401  pylint: disable=unused-import  (arms the rank's deadline first)
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
import sok_ev  # pylint: disable=wrong-import-position

sok_ev.init()


def hang_between_exchanges():
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        table = sok_ev.get_embedding_variable("t", embedding_dim=4, target_gpu=-1)
        ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([7, 8 + hvd.rank()], tf.int64), [2, 1])
        looked_up = sok_ev.lookup_sparse([table], [ids])[0]
        keys_received = [
            op.outputs[0] for op in graph.get_operations() if op.type == "SokEv>UnpackKeyMessage"
        ]
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(looked_up)
        print(f"[rank {hvd.rank()}] first step done", flush=True)
        if hvd.rank() == 1:
            sess.run(keys_received)
            time.sleep(3600)
        try:
            sess.run(looked_up)
        except tf.errors.OpError as error:
            print(f"[rank {hvd.rank()}] failed: {error.message}", flush=True)
            os._exit(4)  # pylint: disable=protected-access


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fault", choices=["die", "hang", "hang-between-exchanges"], required=True)
    args = parser.parse_args()
    if args.fault == "hang-between-exchanges":
        hang_between_exchanges()
        return
    if hvd.rank() == 1:
        if args.fault == "die":
            os._exit(3)  # pylint: disable=protected-access
        time.sleep(3600)
    table = sok_ev.get_embedding_variable("t", embedding_dim=4)
    ids = tf.SparseTensor([[0, 0]], tf.constant([7], tf.int64), [1, 1])
    sok_ev.lookup_sparse([table], [ids])


if __name__ == "__main__":
    main()
