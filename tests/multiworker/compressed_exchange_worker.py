"""One rank of the compressed exchange tests (test_exchange_dtype_two_workers.py).

  python compressed_exchange_worker.py --out DIR --cases EXCHANGE:PLACEMENT:MODE[:mean],...

EXCHANGE is default (no exchange_dtype argument), float32, bfloat16 or
float16; PLACEMENT sharded (target_gpu -1) or worker1 (target_gpu 1); MODE
graph (tf.compat.v1.Session) or eager (tf.function); a fourth field "mean"
combines each sample as the mean of its rows weighted by
exchange_data.entry_weights (sum otherwise). Each case builds
harness.TABLES (int64 and int32 keys) and runs one SGD step on this rank's
batch of exchange_data.step_data, recording under "<case>/" the embeddings
of the forward pass and this rank's shard of each table after the step.
"""

import argparse

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import exchange_data
import harness

hvd.init()
import sok_ev  # pylint: disable=wrong-import-position

sok_ev.init()
RANK, WORKERS = hvd.rank(), hvd.size()
PLACEMENTS = {"sharded": [-1, -1], "worker1": [1, 1]}


def lookup(tables, batches, exchange, combiner):
    kwargs = {} if exchange == "default" else {"exchange_dtype": getattr(tf, exchange)}
    shapes = [[b.batch_size, t["hotness"]] for b, t in zip(batches, harness.TABLES)]
    sparse_ids = [tf.SparseTensor(b.indices, b.values, s) for b, s in zip(batches, shapes)]
    weights = None
    if combiner == "mean":
        weights = [
            tf.SparseTensor(b.indices, exchange_data.entry_weights(b), s)
            for b, s in zip(batches, shapes)
        ]
    return sok_ev.lookup_sparse(tables,
                                sparse_ids,
                                combiners=[combiner] * len(tables),
                                sp_weights=weights,
                                **kwargs)


def loss_of(embeddings, coefficients):
    """Linear, so each sample's gradient is its coefficients, exactly."""
    return tf.add_n([tf.reduce_sum(e * c) for e, c in zip(embeddings, coefficients)])


def run_graph(case, exchange, targets, combiner):
    batches, coefficients = exchange_data.step_data(WORKERS)
    with tf.Graph().as_default() as graph:
        tables = harness.make_tables(targets, prefix=case.replace(':', '_') + '_')
        embeddings = lookup(tables, batches[RANK], exchange, combiner)
        loss = loss_of(embeddings, coefficients[RANK])
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(exchange_data.LEARNING_RATE)
        train = optimizer.minimize(loss)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            forward, _ = session.run([embeddings, train])
            shards = session.run([v.export() for v in tables])
    return forward, shards


def run_eager(case, exchange, targets, combiner):
    batches, coefficients = exchange_data.step_data(WORKERS)
    tables = harness.make_tables(targets, prefix=case.replace(':', '_') + '_')
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(exchange_data.LEARNING_RATE)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            embeddings = lookup(tables, batches[RANK], exchange, combiner)
            loss = loss_of(embeddings, coefficients[RANK])
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return embeddings

    forward = [e.numpy() for e in train_step()]
    shards = [[x.numpy() for x in v.export()] for v in tables]
    return forward, shards


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True)
    args = parser.parse_args()
    results = {}
    for case in args.cases.split(","):
        exchange, placement, mode, *rest = case.split(":")
        run = run_graph if mode == "graph" else run_eager
        forward, shards = run(case, exchange, PLACEMENTS[placement], rest[0] if rest else "sum")
        for t in range(len(harness.TABLES)):
            results[f"{case}/emb{t}"] = forward[t]
            results[f"{case}/keys{t}"] = shards[t][0].astype(np.int64)
            results[f"{case}/values{t}"] = shards[t][1]
    harness.save_rank_results(args.out, RANK, results)


if __name__ == "__main__":
    main()
