"""One rank of the multi-worker checkpoint tests (launched by harness.launch).

  python checkpoint_worker.py --out DIR --root ROOT [--restore TAG] [--save TAG]
      [--apis saver,monitored,checkpoint] [--mistakes] [--interrupt]

For each API -- tf.compat.v1.train.Saver ("saver"), MonitoredTrainingSession
("monitored"), tf.train.Checkpoint ("checkpoint") -- this rank builds the
tables of TABLES (their placement depends on the worker count), restores
the checkpoint saved with TAG (--restore), records its shard of every table,
trains STEPS steps on its own batches and saves with TAG (--save), recording
its shard again. Checkpoints live under ROOT (the file system every worker
shares), one directory per API; each worker does what docs/checkpoints.md's
"Several workers" says:

  saver       saver.save(sess, ROOT/saver/<TAG>) and
              saver.restore(sess, ROOT/saver/<TAG>) on every worker;
  monitored   MonitoredTrainingSession(checkpoint_dir=ROOT/monitored,
              save_checkpoint_steps=...) on every worker, with a hook
              running hvd.broadcast_global_variables(0);
  checkpoint  tf.train.CheckpointManager on ROOT/checkpoint (worker 0) or
              ROOT/checkpoint/worker-<rank> (the others), restore from
              tf.train.latest_checkpoint(ROOT/checkpoint) on every worker.

--restore latest restores the Saver's latest checkpoint. --mistakes also
records the errors of four mistakes; --interrupt only saves once, then makes
worker 1 die in the middle of its next save.
Results: "<api>/<when>/t<i>/<field>" with when in {restored, saved} and field
in {keys, rows, frequencies, versions, slots}, plus "<api>/<when>/bias".
"""
import argparse
import contextlib
import os
import threading
import time

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import harness

hvd.init()
import sok_ev  # pylint: disable=wrong-import-position

sok_ev.init()
RANK, WORKERS = hvd.rank(), hvd.size()

# name, dim, key dtype, target_gpu (-1 sharded; "last": the last worker).
TABLES = (("t0", 4, tf.int64, -1), ("t1", 3, tf.int32, 0), ("t2", 2, tf.int64, "last"))
KEYS = 200  # keys in [0, KEYS): they repeat within and across workers
BATCH, HOTNESS, STEPS = 6, 3, 3


def target_of(target):
    return WORKERS - 1 if target == "last" else target


def make_tables():
    return [
        sok_ev.get_embedding_variable(name,
                                      dim,
                                      key_dtype=key_dtype,
                                      initializer=tf.random_uniform_initializer(-1, 1, seed=7),
                                      target_gpu=target_of(target))
        for name, dim, key_dtype, target in TABLES
    ]


def batch_of(tag, api, step, table):
    """This rank's batch: (indices, keys, dense shape, upstream)."""
    rng = np.random.default_rng([sum(map(ord, f"{tag}/{api}")), WORKERS, RANK, step, table])
    hotness = rng.integers(1, HOTNESS + 1, size=BATCH)
    indices = np.array([[b, j] for b in range(BATCH) for j in range(hotness[b])], np.int64)
    keys = rng.integers(0, KEYS, size=len(indices))
    upstream = rng.normal(size=(BATCH, TABLES[table][1])).astype(np.float32)
    return indices, keys, np.array([BATCH, HOTNESS], np.int64), upstream


class Model:
    """The tables, a dense bias (trained on each worker's own gradient, so
    the workers' copies differ until a restore) and Adagrad."""

    def __init__(self, graph_mode):
        self.tables = make_tables()
        self.bias = tf.compat.v1.get_variable("bias", initializer=tf.ones(
            [2])) if graph_mode else tf.Variable(tf.ones([2]))
        self.optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)

    def loss(self, sparse_ids, upstreams):
        embeddings = sok_ev.lookup_sparse(self.tables, sparse_ids)
        return (tf.add_n([tf.reduce_sum(e * u) for e, u in zip(embeddings, upstreams)]) +
                tf.reduce_sum(self.bias * self.bias) * (RANK + 1))

    def exports(self):
        return [t.export_full() for t in self.tables]


def record(results, prefix, exports, bias):
    for t, (keys, rows, frequencies, versions, slot_names, _) in enumerate(exports):
        results[f"{prefix}/t{t}/keys"] = np.asarray(keys).astype(np.int64)
        results[f"{prefix}/t{t}/rows"] = np.asarray(rows)
        results[f"{prefix}/t{t}/frequencies"] = np.asarray(frequencies)
        results[f"{prefix}/t{t}/versions"] = np.asarray(versions)
        results[f"{prefix}/t{t}/slots"] = "|".join(s.decode() for s in np.asarray(slot_names))
    results[f"{prefix}/bias"] = np.asarray(bias)


# --- tf.compat.v1 graphs: Saver and MonitoredTrainingSession -----------------


class GraphModel(Model):

    def __init__(self):
        super().__init__(graph_mode=True)
        self.feeds = []
        sparse_ids, upstreams = [], []
        for table in self.tables:
            indices = tf.compat.v1.placeholder(tf.int64, [None, 2])
            keys = tf.compat.v1.placeholder(tf.int64, [None])
            shape = tf.compat.v1.placeholder(tf.int64, [2])
            upstream = tf.compat.v1.placeholder(tf.float32, [None, table.embedding_dim])
            sparse_ids.append(tf.SparseTensor(indices, tf.cast(keys, table.key_dtype), shape))
            upstreams.append(upstream)
            self.feeds.append((indices, keys, shape, upstream))
        self.step = tf.compat.v1.train.get_or_create_global_step()
        self.train = self.optimizer.minimize(self.loss(sparse_ids, upstreams),
                                             global_step=self.step)
        self.state = (self.exports(), self.bias)

    def feed(self, tag, api, step):
        feed = {}
        for t, placeholders in enumerate(self.feeds):
            feed.update(zip(placeholders, batch_of(tag, api, step, t)))
        return feed


def run_saver(args, results):
    directory = os.path.join(args.root, "saver")
    os.makedirs(directory, exist_ok=True)
    with tf.Graph().as_default():
        model = GraphModel()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            if args.restore:
                path = (tf.train.latest_checkpoint(directory)
                        if args.restore == "latest" else os.path.join(directory, args.restore))
                saver.restore(session, path)
                results["saver/restored_from"] = os.path.basename(path)
                record(results, "saver/restored", *session.run(model.state))
            else:
                session.run(tf.compat.v1.global_variables_initializer())
            if args.save:
                for step in range(STEPS):
                    session.run(model.train, model.feed(args.save, "saver", step))
                saver.save(session, os.path.join(directory, args.save))
                record(results, "saver/saved", *session.run(model.state))


class BroadcastHook(tf.compat.v1.train.SessionRunHook):
    """hvd.BroadcastGlobalVariablesHook(0), which Horovod defines only where
    tf.train.SessionRunHook exists (not in TensorFlow 2.21)."""

    def begin(self):
        self.broadcast = hvd.broadcast_global_variables(0)

    def after_create_session(self, session, coord):
        del coord
        session.run(self.broadcast)


def run_monitored(args, results):
    with tf.Graph().as_default():
        model = GraphModel()
        steps = STEPS if args.save else 0
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=os.path.join(
                args.root, "monitored"),
                                                         hooks=[BroadcastHook()],
                                                         save_checkpoint_steps=2,
                                                         save_summaries_steps=None,
                                                         save_summaries_secs=None,
                                                         log_step_count_steps=None) as session:
            if args.restore:
                record(results, "monitored/restored", *session.run(model.state))
            for step in range(steps):
                session.run(model.train, model.feed(args.save, "monitored", step))
            if args.save:
                record(results, "monitored/saved", *session.run(model.state))
        # Leaving the session saved the last step on every worker.


# --- tf.train.Checkpoint, eagerly ---------------------------------------------


def run_checkpoint(args, results):
    model = Model(graph_mode=False)
    directory = os.path.join(args.root, "checkpoint")
    checkpoint = tf.train.Checkpoint(tables=model.tables,
                                     bias=model.bias,
                                     optimizer=model.optimizer)
    if args.restore:
        checkpoint.restore(tf.train.latest_checkpoint(directory)).assert_existing_objects_matched()
        record(results, "checkpoint/restored", model.exports(), model.bias)
    if args.save:
        for step in range(STEPS):
            parts = [batch_of(args.save, "checkpoint", step, t) for t in range(len(TABLES))]
            sparse_ids = [
                tf.SparseTensor(i, tf.cast(k, table.key_dtype), s)
                for (i, k, s, _), table in zip(parts, model.tables)
            ]
            with tf.GradientTape() as tape:
                loss = model.loss(sparse_ids, [u for *_, u in parts])
            variables = model.tables + [model.bias]
            model.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        # Worker 0 writes the checkpoint; the others a directory of their own.
        mine = directory if RANK == 0 else os.path.join(directory, f"worker-{RANK}")
        tf.train.CheckpointManager(checkpoint, mine, max_to_keep=2).save()
        record(results, "checkpoint/saved", model.exports(), model.bias)
        # The optimizer state broadcasts (dense slots copied, table slots
        # checked): hvd.broadcast_variables(opt.variables(), 0).
        hvd.broadcast_variables(model.optimizer.variables(), root_rank=0)
        dense_slot = model.optimizer.get_slot(model.bias, "accumulator")
        results["checkpoint/broadcast_dense_slot"] = dense_slot.numpy()


# --- Mistakes and interruptions -----------------------------------------------


def message_of(run):
    try:
        run()
    except (ValueError, tf.errors.OpError) as error:
        return str(error)
    return ""


@contextlib.contextmanager
def trained_session(directory, tag):
    """A new graph and session: the model, initialized and trained one step,
    and a Saver; yields (model, saver, session)."""
    os.makedirs(directory, exist_ok=True)
    with tf.Graph().as_default():
        model = GraphModel()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(model.train, model.feed(tag, "saver", 0))
            yield model, saver, session


def record_mistakes(args, results):
    directory = os.path.join(args.root, "mistakes")
    # Saver.save with a path of each worker's own.
    with trained_session(directory, "mistakes") as (_, saver, session):
        results["mistake/saver_paths"] = message_of(
            lambda: saver.save(session, os.path.join(directory, f"own-{RANK}")))
        path = saver.save(session, os.path.join(directory, "shared"))
    # Only worker 0 restores, then broadcasts (the single-worker habit).
    with tf.Graph().as_default():
        model = GraphModel()
        saver = tf.compat.v1.train.Saver()
        broadcast = hvd.broadcast_global_variables(0)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            if RANK == 0:
                saver.restore(session, path)
            results["mistake/restore_on_worker_0_only"] = message_of(lambda: session.run(broadcast))
    # tf.train.Checkpoint saved to the same path by every worker.
    model = Model(graph_mode=False)
    checkpoint = tf.train.Checkpoint(tables=model.tables)
    results["mistake/checkpoint_same_path"] = message_of(
        lambda: checkpoint.write(os.path.join(directory, "tf2")))
    # tf.train.Checkpoint restored from different checkpoints (each worker
    # would keep its own keys from its own step).
    for name in ("tf2_a", "tf2_b"):
        checkpoint.write(os.path.join(directory, name if RANK == 0 else f"{name}-{RANK}"))
    # Worker 0 merges the parts after the others' write returned: they read
    # its checkpoints only after a collective it joins once it is done.
    hvd.allreduce(tf.constant(0.0), name="checkpoints_written")
    theirs = os.path.join(directory, "tf2_a" if RANK == 0 else "tf2_b")
    results["mistake/checkpoint_restore_paths"] = message_of(lambda: checkpoint.restore(theirs))


def interrupt(args, results):
    """Saves ROOT/saver/good; then worker 1 dies in the middle of the next
    save: once worker 0 has written its part of ROOT/saver/bad, before worker
    1 joins the barrier after which worker 0 merges the parts."""
    directory = os.path.join(args.root, "saver")
    dying = threading.Event()
    if RANK == 1:
        part = os.path.join(directory, "bad_temp", "sok_ev_tables_0_worker_00000_of_00002.index")
        _die_before_parts_written_barrier(dying, part)
    with trained_session(directory, "interrupted") as (model, saver, session):
        saver.save(session, os.path.join(directory, "good"))
        record(results, "saver/saved", *session.run(model.state))
        harness.save_rank_results(args.out, RANK, results)
        session.run(model.train, model.feed("interrupted", "saver", 1))
        dying.set()
        saver.save(session, os.path.join(directory, "bad"))


def _die_before_parts_written_barrier(dying, part):
    """Makes the Saver built next wait, once `dying` is set, for `part` (worker
    0's part file) before this worker joins the "parts written" barrier, then
    exit. Waiting inside the graph, rather than watching from a thread, keeps
    worker 0 from merging (and deleting the part) before this worker dies."""
    barrier = sok_ev.checkpoint._barrier  # pylint: disable=protected-access

    def die_when_written():
        if dying.is_set():
            while not os.path.exists(part):
                time.sleep(0.001)
            os._exit(3)  # pylint: disable=protected-access
        return True

    def gated(name, after):
        if name == "sok_ev_checkpoint_parts_written":
            after = list(after) + [tf.py_function(die_when_written, [], tf.bool)]
        return barrier(name, after)

    sok_ev.checkpoint._barrier = gated  # pylint: disable=protected-access


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--restore")
    parser.add_argument("--save")
    parser.add_argument("--apis", default="saver,monitored,checkpoint")
    parser.add_argument("--mistakes", action="store_true")
    parser.add_argument("--interrupt", action="store_true")
    args = parser.parse_args()
    results = {}
    if args.interrupt:
        interrupt(args, results)
    else:
        runs = {"saver": run_saver, "monitored": run_monitored, "checkpoint": run_checkpoint}
        for api in args.apis.split(","):
            runs[api](args, results)
        if args.mistakes:
            record_mistakes(args, results)
    harness.save_rank_results(args.out, RANK, results)


if __name__ == "__main__":
    main()
