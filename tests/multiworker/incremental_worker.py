"""One rank of the multi-worker incremental-checkpoint test (launched by
harness.launch).

  python incremental_worker.py --out DIR --root ROOT (--save | --restore)

Tables: t0 sharded over every worker with a CounterFilter(2), t1 whole on
worker 0; Adagrad. --save: a full save with sok_ev.Saver(
incremental_save_restore=True), then training steps with incremental saves
in between, and a full save by a plain Saver at the last increment's moment
(ROOT/incr, ROOT/ref). Both modes then restore the last increment (its
chain) and the full save into fresh graphs, each followed by one training
step. Results: "<incr|ref>/<restored|stepped>/t<i>/<field>".
"""
import argparse
import os

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import harness

hvd.init()
import sok_ev  # pylint: disable=wrong-import-position

sok_ev.init()
RANK, WORKERS = hvd.rank(), hvd.size()
KEYS, BATCH = 60, 8


def build():
    tables = [
        sok_ev.get_embedding_variable(
            "t0",
            3,
            initializer=tf.random_uniform_initializer(-1, 1, seed=5),
            ev_option=sok_ev.EmbeddingVariableOption(filter_option=sok_ev.CounterFilter(2))),
        sok_ev.get_embedding_variable("t1",
                                      2,
                                      key_dtype=tf.int32,
                                      initializer=tf.random_uniform_initializer(-1, 1, seed=6),
                                      target_gpu=0),
    ]
    keys = [
        tf.compat.v1.placeholder(t.key_dtype, [BATCH], name=f"keys{i}")
        for i, t in enumerate(tables)
    ]
    indices = np.stack([np.arange(BATCH), np.zeros(BATCH, np.int64)], 1)
    sparse = [tf.SparseTensor(indices, k, [BATCH, 1]) for k in keys]
    embeddings = sok_ev.lookup_sparse(tables, sparse)
    loss = tf.add_n([tf.reduce_sum(e * e) for e in embeddings])
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
    return tables, keys, train


def feed(keys, step):
    rng = np.random.default_rng([WORKERS, RANK, step])
    return {k.name: rng.integers(0, KEYS, BATCH).astype(k.dtype.as_numpy_dtype) for k in keys}


def record(results, prefix, sess, tables):
    for t, table in enumerate(tables):
        keys, rows, frequencies, versions, _, _ = sess.run(table.export_full())
        order = np.argsort(keys)
        results[f"{prefix}/t{t}/keys"] = keys[order].astype(np.int64)
        results[f"{prefix}/t{t}/rows"] = rows[order]
        results[f"{prefix}/t{t}/frequencies"] = frequencies[order]
        results[f"{prefix}/t{t}/versions"] = versions[order]


def save(root):
    for directory in ("full", "ref"):
        os.makedirs(os.path.join(root, directory), exist_ok=True)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        tables, keys, train = build()
        saver = sok_ev.Saver(incremental_save_restore=True)
        reference = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, feed(keys, 0))
        saver.save(sess, os.path.join(root, "full", "model"), global_step=1)
        for step in (1, 2, 3):
            sess.run(train, feed(keys, step))
            saver.incremental_save(sess, os.path.join(root, "incr", "model"), global_step=step + 1)
        reference.save(sess, os.path.join(root, "ref", "model"))


def restore(root, results):
    paths = {
        "incr": tf.train.latest_checkpoint(os.path.join(root, "incr")),
        "ref": os.path.join(root, "ref", "model"),
    }
    for name, path in paths.items():
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            tables, keys, train = build()
            sok_ev.Saver(incremental_save_restore=True).restore(sess, path)
            record(results, f"{name}/restored", sess, tables)
            sess.run(train, feed(keys, 10))
            record(results, f"{name}/stepped", sess, tables)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    if args.save:
        save(args.root)
    results = {}
    restore(args.root, results)
    harness.save_rank_results(args.out, RANK, results)


if __name__ == "__main__":
    main()
