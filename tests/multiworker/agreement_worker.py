"""One rank of test_agreement.py: workers that build or run different lookups.

  python agreement_worker.py --out DIR --scenario NAME

Scenarios (rank 0 is the odd one out where there is one):
  forgot_init       hvd.init() without sok_ev.init(), then a lookup.
  extra_table       graph mode: every rank trains on table t0; rank 0 also
                    looks up table t1, in a lookup of its own.
  eval_on_rank0     graph mode: every rank trains; after two steps rank 0
                    builds and runs an evaluation lookup of t0.
  eval_built_everywhere_run_on_rank0
                    graph mode: every rank trains; after two steps every
                    rank builds an evaluation lookup of t0, rank 0 alone
                    runs it.
  eval_on_rank0_tf2 tf.function training; after two steps rank 0 runs an
                    eager evaluation lookup of t0.
  second_lookup     graph mode: after two training steps every rank builds a
                    second lookup of the same table (in the training graph,
                    then in a new graph), runs it, and goes on training.
  constant_keys     graph mode: a lookup of constant keys, and the same keys
                    fed through a placeholder.
  saver_save_on_rank0
                    graph mode: every rank trains; after two steps rank 0
                    saves with tf.compat.v1.train.Saver, alone.
  checkpoint_save_on_rank0
                    tf.function training; after two steps rank 0 writes a
                    tf.train.Checkpoint, alone.
  saver_write_fails_on_rank1
                    graph mode: every rank trains and saves with a Saver;
                    rank 1 cannot write its part (a path under /proc);
                    each rank records the save's error, then trains on.
  saver_directory_missing
                    graph mode: every rank saves with a Saver into a
                    directory that does not exist, records the error, and
                    trains on.
  checkpoint_write_fails_on_rank1
                    the same with tf.function training and an eager
                    tf.train.Checkpoint.
  different_combiners
                    graph mode: rank 0 looks t0 up with combiner "sum", the
                    others with "mean".

Each rank records "error" (the message of the first exception, "" if none),
"error_type" and "seconds" (from the point where the ranks diverge to the
error), plus the scenario's values ("save_error", "save_error_type" and
"save_seconds" where a save fails and training goes on).
"""
import argparse
import os
import tempfile
import time

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import harness

hvd.init()
import sok_ev  # pylint: disable=wrong-import-position
from sok_ev import checkpoint  # pylint: disable=wrong-import-position

RANK, WORKERS = hvd.rank(), hvd.size()
DIM = 4


def batch(step):
    """This rank's [4, 2] batch of step `step` (keys in [0, 40))."""
    rng = np.random.default_rng([RANK, step])
    keys = rng.integers(0, 40, size=8)
    indices = np.array([[i // 2, i % 2] for i in range(8)], np.int64)
    return indices, keys


def graph_training(steps, after_steps):
    """Trains t0 in a Session; after `steps` steps calls after_steps(session,
    feed_of, table, ids) and returns what it returns."""
    with tf.Graph().as_default():
        table = sok_ev.get_embedding_variable("t0", embedding_dim=DIM)
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        emb = sok_ev.lookup_sparse([table], [ids])[0]
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(emb**2))

        def feed_of(step):
            indices, keys = batch(step)
            return {ids: tf.compat.v1.SparseTensorValue(indices, keys, [4, 2])}

        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for step in range(steps):
                session.run(train, feed_of(step))
            return after_steps(session, feed_of, table, ids, emb, train)


def scenario_forgot_init(results):
    del results
    table = sok_ev.get_embedding_variable("t0", embedding_dim=DIM)
    sok_ev.lookup_sparse([table], [tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])])


def scenario_extra_table(results):
    sok_ev.init()

    def after(session, feed_of, table, ids, emb, train):
        del table, emb
        results["diverged_at"] = np.array(time.monotonic())
        if RANK == 0:
            extra = sok_ev.get_embedding_variable("t1", embedding_dim=DIM)
            sok_ev.lookup_sparse([extra], [ids])
        for step in range(2, 10):
            session.run(train, feed_of(step))

    graph_training(2, after)


def scenario_eval_on_rank0(results):
    sok_ev.init()

    def after(session, feed_of, table, ids, emb, train):
        del emb
        results["diverged_at"] = np.array(time.monotonic())
        for step in range(2, 10):
            if RANK == 0:
                evaluation = sok_ev.lookup_sparse([table], [ids], combiners=["mean"])[0]
                session.run(evaluation, feed_of(step))
            session.run(train, feed_of(step))

    graph_training(2, after)


def scenario_eval_built_everywhere_run_on_rank0(results):
    sok_ev.init()

    def after(session, feed_of, table, ids, emb, train):
        del emb
        # Every rank builds it (the build-time check passes); rank 0 alone runs it.
        evaluation = sok_ev.lookup_sparse([table], [ids], combiners=["mean"])[0]
        results["diverged_at"] = np.array(time.monotonic())
        for step in range(2, 10):
            if RANK == 0:
                session.run(evaluation, feed_of(step))
            session.run(train, feed_of(step))

    graph_training(2, after)


def tf_function_training(results, between_steps, every_rank=False):
    """Trains t0 with a tf.function for two steps; then, for 8 more steps,
    rank 0 (every rank with every_rank) calls between_steps(table, step)
    before each."""
    sok_ev.init()
    table = sok_ev.get_embedding_variable("t0", embedding_dim=DIM)
    optimizer = tf.keras.optimizers.Adagrad(0.1)

    @tf.function
    def train_step(indices, keys):
        with tf.GradientTape() as tape:
            emb = sok_ev.lookup_sparse([table], [tf.SparseTensor(indices, keys, [4, 2])])[0]
            loss = tf.reduce_sum(emb**2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    for step in range(2):
        train_step(*batch(step))
    results["diverged_at"] = np.array(time.monotonic())
    for step in range(2, 10):
        if RANK == 0 or every_rank:
            between_steps(table, step)
        train_step(*batch(step))


def scenario_eval_on_rank0_tf2(results):

    def evaluate(table, step):
        indices, keys = batch(step)
        tf.nn.embedding_lookup_sparse(table, tf.SparseTensor(indices, keys, [4, 2]), None)

    tf_function_training(results, evaluate)


def embed(table, ids):
    """The model's one call site of lookup_sparse."""
    return sok_ev.lookup_sparse([table], [ids])[0]


def scenario_same_site_twice_on_rank0(results):
    # Rank 0 builds a second lookup through the same helper (an auxiliary
    # loss): the same file and line as the training lookup, built again.
    sok_ev.init()
    with tf.Graph().as_default():
        table = sok_ev.get_embedding_variable("t0", embedding_dim=DIM)
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(
            tf.reduce_sum(embed(table, ids)**2))

        def feed_of(step):
            indices, keys = batch(step)
            return {ids: tf.compat.v1.SparseTensorValue(indices, keys, [4, 2])}

        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for step in range(2):
                session.run(train, feed_of(step))
            results["diverged_at"] = np.array(time.monotonic())
            auxiliary = embed(table, ids) if RANK == 0 else None
            for step in range(2, 10):
                if auxiliary is not None:
                    session.run(auxiliary, feed_of(step))
                session.run(train, feed_of(step))


def scenario_second_lookup(results):
    sok_ev.init()

    def after(session, feed_of, table, ids, emb, train):
        second = sok_ev.lookup_sparse([table], [ids])[0]  # same graph, built late
        feed = feed_of(2)
        results["second"], results["first"] = session.run([second, emb], feed)
        for step in range(2, 4):
            session.run(train, feed_of(step))
        results["second_after"], results["first_after"] = session.run([second, emb], feed)
        return session.run(table.export())

    keys, rows = graph_training(2, after)
    # A new graph over the same table name, built after training (an export
    # graph): its lookup must work too.
    with tf.Graph().as_default():
        table = sok_ev.get_embedding_variable("t0", embedding_dim=DIM)
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        emb = sok_ev.lookup_sparse([table], [ids])[0]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            indices, batch_keys = batch(5)
            results["new_graph"] = session.run(
                emb, {ids: tf.compat.v1.SparseTensorValue(indices, batch_keys, [4, 2])})
    results["trained_keys"] = keys


def scenario_constant_keys(results):
    """A graph lookup whose keys are constants (a pre-fill or export step):
  Grappler may evaluate constant subgraphs while optimizing, which must not
  run the exchange's collective there."""
    sok_ev.init()
    with tf.Graph().as_default():
        table = sok_ev.get_embedding_variable("t0", embedding_dim=DIM)
        indices, keys = batch(0)
        constant = sok_ev.lookup_sparse([table], [tf.SparseTensor(indices, keys, [4, 2])])[0]
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        fed = sok_ev.lookup_sparse([table], [ids])[0]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            results["constant"] = session.run(constant)
            results["fed"] = session.run(
                fed, {ids: tf.compat.v1.SparseTensorValue(indices, keys, [4, 2])})


def scenario_saver_save_on_rank0(results):
    sok_ev.init()

    def after(session, feed_of, table, ids, emb, train):
        del table, ids, emb
        saver = tf.compat.v1.train.Saver()  # built by every rank, as the same graph
        results["diverged_at"] = np.array(time.monotonic())
        for step in range(2, 10):
            if RANK == 0:
                saver.save(session, os.path.join(tempfile.mkdtemp(), "model"))
            session.run(train, feed_of(step))

    graph_training(2, after)


def scenario_checkpoint_save_on_rank0(results):

    def save(table, step):
        del step
        tf.train.Checkpoint(table=table).write(os.path.join(tempfile.mkdtemp(), "model"))

    tf_function_training(results, save)


def unwritable_on_rank1():
    """Makes this rank's Embedding Variable parts go under /proc, where
    nothing can be written, if it is rank 1."""
    if RANK != 1:
        return
    write = checkpoint._save_tables  # pylint: disable=protected-access

    def write_under_proc(prefix, *args, **kwargs):
        return write(tf.strings.join(["/proc/sok-ev-test/", prefix]), *args, **kwargs)

    checkpoint._save_tables = write_under_proc  # pylint: disable=protected-access


def record_save(results, save):
    """Runs save(), recording its error; training goes on after it."""
    start = time.monotonic()
    try:
        save()
    except Exception as error:  # pylint: disable=broad-except
        results["save_error"] = str(error)
        results["save_error_type"] = type(error).__name__
    results["save_seconds"] = np.array(time.monotonic() - start)


def saver_training_with_a_failing_save(results, directory):
    """Graph training; after two steps every rank saves with a Saver into
    `directory`, records the save's error, and trains on."""

    def after(session, feed_of, table, ids, emb, train):
        del table, ids, emb
        saver = tf.compat.v1.train.Saver()
        record_save(results, lambda: saver.save(session, os.path.join(directory, "model")))
        results["diverged_at"] = np.array(time.monotonic())
        for step in range(2, 5):
            session.run(train, feed_of(step))

    graph_training(2, after)


def scenario_saver_write_fails_on_rank1(results):
    sok_ev.init()
    unwritable_on_rank1()
    directory = os.path.join(os.environ["SOK_EV_TEST_SHARED_DIR"], "saver")
    os.makedirs(directory, exist_ok=True)
    saver_training_with_a_failing_save(results, directory)


def scenario_saver_directory_missing(results):
    sok_ev.init()
    saver_training_with_a_failing_save(
        results, os.path.join(os.environ["SOK_EV_TEST_SHARED_DIR"], "missing"))


def scenario_checkpoint_write_fails_on_rank1(results):
    unwritable_on_rank1()
    directory = os.path.join(os.environ["SOK_EV_TEST_SHARED_DIR"], f"checkpoint-{RANK}")
    saved = []

    def save_once(table, step):
        del step
        if not saved:
            saved.append(True)
            checkpoint_of_table = tf.train.Checkpoint(table=table)
            record_save(results, lambda: checkpoint_of_table.write(os.path.join(directory, "m")))

    tf_function_training(results, save_once, every_rank=True)


def scenario_different_combiners(results):
    sok_ev.init()
    with tf.Graph().as_default():
        table = sok_ev.get_embedding_variable("t0", embedding_dim=DIM)
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        results["diverged_at"] = np.array(time.monotonic())
        sok_ev.lookup_sparse([table], [ids], combiners=["sum" if RANK == 0 else "mean"])


SCENARIOS = {
    "forgot_init": scenario_forgot_init,
    "extra_table": scenario_extra_table,
    "eval_on_rank0": scenario_eval_on_rank0,
    "eval_built_everywhere_run_on_rank0": scenario_eval_built_everywhere_run_on_rank0,
    "eval_on_rank0_tf2": scenario_eval_on_rank0_tf2,
    "second_lookup": scenario_second_lookup,
    "same_site_twice_on_rank0": scenario_same_site_twice_on_rank0,
    "constant_keys": scenario_constant_keys,
    "saver_save_on_rank0": scenario_saver_save_on_rank0,
    "checkpoint_save_on_rank0": scenario_checkpoint_save_on_rank0,
    "different_combiners": scenario_different_combiners,
    "saver_write_fails_on_rank1": scenario_saver_write_fails_on_rank1,
    "checkpoint_write_fails_on_rank1": scenario_checkpoint_write_fails_on_rank1,
    "saver_directory_missing": scenario_saver_directory_missing,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    args = parser.parse_args()
    results = {"error": "", "error_type": ""}
    try:
        SCENARIOS[args.scenario](results)
    except Exception as error:  # pylint: disable=broad-except
        results["error"] = str(error)
        results["error_type"] = type(error).__name__
        if "diverged_at" in results:
            results["seconds"] = np.array(time.monotonic() - results.pop("diverged_at"))
    results.pop("diverged_at", None)
    harness.save_rank_results(args.out, RANK, results)


if __name__ == "__main__":
    main()
