"""One rank of tests/multiworker/test_feature_columns_sharded.py (launched by harness.launch).

  python feature_column_worker.py --out DIR [--init sok_ev|collective] [--partition-num N]

--init sok_ev: hvd.init() and sok_ev.init(), then install_deeprec_api().
--init collective: as DeepRec's modelzoo scripts start with
--group_embedding collective: install_deeprec_api(), then
tf.config.experimental.enable_distributed_strategy(strategy="collective")
(which starts Horovod and sok-ev), the column built inside
tf.feature_column.group_embedding_column_scope.

DeepRec's way, after sok_ev.install_deeprec_api(): in a TF1 graph, a
categorical_column_with_embedding over int64 ids and an embedding_column
(combiner 'mean') read by input_layer (with --partition-num N > 1 the column
has DeepRec's N-part partitioned Embedding Variable, each part sharded the
same way); the column's Embedding Variable keeps
its default placement, sharded over the workers (target_gpu -1). Each rank
trains STEPS Adagrad steps on its share of each global batch (rows
[rank*b, (rank+1)*b) of GLOBAL_BATCH; some rows empty), loss = the sum of
the layer's output times a fixed upstream gradient.

Each rank also trains, alone, the reference: a dense tf.Variable holding the
same rows, read by tf.nn.embedding_lookup_sparse(combiner='mean') on the
whole global batches with the same Adagrad (what one worker does).

Results (rank<r>.npz), after each step t:
  sok/<t>/keys, sok/<t>/rows   this rank's shard of the column's table (of
                               every part);
  twin/<t>/rows                the reference's table;
and "variable" (the column's Embedding Variable's name, its first part's),
"parts", "target_gpu" (its placement) and "initial_rows" (the rows both
tables start from).
"""
import argparse
import contextlib

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import harness  # noqa: F401  (arms the rank's deadline)
import sok_ev

_parser = argparse.ArgumentParser()
_parser.add_argument("--out", required=True)
_parser.add_argument("--init", choices=["sok_ev", "collective"], default="sok_ev")
_parser.add_argument("--partition-num", type=int, default=None)
ARGS = _parser.parse_args()
if ARGS.init == "collective":
    sok_ev.install_deeprec_api()
    tf.config.experimental.enable_distributed_strategy(strategy="collective")
else:
    hvd.init()
    sok_ev.init()
    sok_ev.install_deeprec_api()
RANK, WORKERS = hvd.rank(), hvd.size()
N_ROWS, DIM, HOTNESS, GLOBAL_BATCH, STEPS = 40, 4, 3, 8, 4
LR, ACCUMULATOR = 0.3, 0.1


def global_batches():
    """STEPS global batches, the same on every rank: (ids [GLOBAL_BATCH,
  HOTNESS] with -1 for no id, so some rows are empty; upstream gradient)."""
    rng = np.random.default_rng(55)
    out = []
    for _ in range(STEPS):
        ids = rng.integers(0, N_ROWS, size=(GLOBAL_BATCH, HOTNESS)).astype(np.int64)
        ids[rng.random(ids.shape) < 0.3] = -1
        ids[1] = -1  # an empty row
        ids[-1, 0] = ids[0, 0]  # a key in both workers' halves
        out.append((ids, rng.normal(size=(GLOBAL_BATCH, DIM)).astype(np.float32)))
    return out


def sparse_value(ids):
    where = np.argwhere(ids >= 0)
    return tf.compat.v1.SparseTensorValue(where, ids[ids >= 0], ids.shape)


def train(batches, build, read):
    """Runs STEPS steps of the graph `build(ids, upstream) -> (output,
  variable)` on `batches`; returns read(sess, variable) after each step."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, HOTNESS])
        upstream = tf.compat.v1.placeholder(tf.float32, [None, DIM])
        output, variable = build(ids, upstream)
        loss = tf.reduce_sum(output * upstream)
        train_op = tf.compat.v1.train.AdagradOptimizer(LR, ACCUMULATOR).minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        states = []
        for batch_ids, up in batches:
            sess.run(train_op, {ids: sparse_value(batch_ids), upstream: up})
            states.append(read(sess, variable))
        return states


def main():
    out = ARGS.out
    matrix = np.random.default_rng(7).normal(size=(N_ROWS, DIM)).astype(np.float32)
    batches = global_batches()
    share = GLOBAL_BATCH // WORKERS
    mine = [(ids[RANK * share:(RANK + 1) * share], up[RANK * share:(RANK + 1) * share])
            for ids, up in batches]
    results = {"initial_rows": matrix}

    def columns(ids, upstream):
        del upstream
        # Key k starts at matrix[k] (DeepRec's default_value_dim rule).
        option = tf.EmbeddingVariableOption(init_option=tf.InitializerOption(
            default_value_dim=N_ROWS))
        column = tf.feature_column.categorical_column_with_embedding(
            "item", dtype=tf.int64, partition_num=ARGS.partition_num, ev_option=option)
        embedding = tf.feature_column.embedding_column(column,
                                                       dimension=DIM,
                                                       combiner="mean",
                                                       initializer=tf.constant_initializer(matrix))
        cols_to_vars = {}
        group = (tf.feature_column.group_embedding_column_scope(
            name="items") if ARGS.init == "collective" else contextlib.nullcontext())
        with group:
            output = tf.feature_column.input_layer({"item": ids}, [embedding],
                                                   cols_to_vars=cols_to_vars)
        parts = cols_to_vars[embedding]
        results["variable"] = parts[0].name
        results["parts"] = len(parts)
        results["target_gpu"] = parts[0].target_gpu
        return output, parts

    def shard(sess, parts):
        exported = sess.run([part.export() for part in parts])
        keys = np.concatenate([k for k, _ in exported])
        rows = np.concatenate([r for _, r in exported])
        order = np.argsort(keys)
        return keys[order].astype(np.int64), rows[order]

    for t, (keys, rows) in enumerate(train(mine, columns, shard)):
        results[f"sok/{t}/keys"], results[f"sok/{t}/rows"] = keys, rows

    def dense(ids, upstream):
        del upstream
        variable = tf.Variable(matrix, name="twin")
        return tf.nn.embedding_lookup_sparse(variable, ids, None, combiner="mean"), variable

    twin = train(batches, dense, lambda sess, variable: sess.run(variable))
    for t, rows in enumerate(twin):
        results[f"twin/{t}/rows"] = rows
    harness.save_rank_results(out, RANK, results)


if __name__ == "__main__":
    main()
