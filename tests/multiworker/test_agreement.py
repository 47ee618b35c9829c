"""Every worker builds and runs the same lookups, or every worker fails fast.

Pinned down (sok_ev/agreement.py, sok_ev/communication.py), on 2 workers:
* hvd.init() without sok_ev.init(): the first lookup raises on every worker,
  naming sok_ev.init() (instead of training unsharded);
* a table looked up by one worker only, an evaluation lookup run by
  worker 0 only (graph mode, built there alone or by every worker, and
  eagerly next to tf.function training), or
  a lookup built again at the same place in the code on worker 0 only:
  every worker ends in an error naming the cause, within seconds of the
  time limit (SOK_EV_LOOKUP_CHECK_TIMEOUT, 5 s here), never a hang;
* a save of Embedding Variables run by worker 0 alone (a Saver in a
  Session, a tf.train.Checkpoint eagerly): every worker ends in an error
  within seconds of the time limit, never a hang;
* a save whose part cannot be written on one worker: an error on every
  worker (a Saver: within seconds of the time limit, the job stopped; a
  tf.train.Checkpoint: at once, naming the worker and its error, and
  training goes on); a Saver save failing on every worker (a missing
  directory): at once, and training goes on;
* workers passing different combiners to one lookup: an error on every
  worker naming the table and both combiners;
* a second lookup of the same table built after training started (an
  evaluation or export graph added later), in the training graph or a new
  one: works, and reads the rows training left;
* a graph lookup of constant keys runs (Grappler must not fold the exchange).
"""
import os
import tempfile

import numpy as np
import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK_TIMEOUT = 5  # SOK_EV_LOOKUP_CHECK_TIMEOUT of the launches
# A diverging worker must fail within the check time limit plus this.
SLACK = 15


def _run(scenario):
    harness.require_horovodrun()
    result = harness.launch(os.path.join(HERE, "agreement_worker.py"),
                            2, ["--scenario", scenario],
                            timeout=150,
                            env={
                                "SOK_EV_LOOKUP_CHECK_TIMEOUT": str(CHECK_TIMEOUT),
                                "SOK_EV_TEST_SHARED_DIR": tempfile.mkdtemp(prefix="sok_ev_agree_")
                            })
    assert not result.timed_out, f"{scenario} hung:\n{result.tail()}"
    assert result.returncode == 0 and len(result.results) == 2, result.tail()
    for got in result.results.values():
        got["launch_tail"] = result.tail()  # the ranks' stderr, for a failure's message
    return result.results


def _described(got):
    """A rank's outcome in full (pytest shortens a dict it prints)."""
    return f"{got['error_type']}: {got['error']}\n--- the launch's output ---\n{got['launch_tail']}"


def test_hvd_init_without_sok_ev_init_fails_at_the_first_lookup_naming_it():
    for rank, got in _run("forgot_init").items():
        assert got["error_type"] == "RuntimeError", _described(got)
        message = str(got["error"])
        assert "sok_ev.init()" in message and "2 workers" in message, message


@pytest.mark.parametrize(
    "scenario", ["extra_table", "eval_on_rank0", "eval_on_rank0_tf2", "same_site_twice_on_rank0"])
def test_a_lookup_on_some_workers_only_fails_on_every_worker_within_seconds(scenario):
    results = _run(scenario)
    # Worker 0 built the lookup the others did not: its error names it.
    message = str(results[0]["error"])
    assert results[0]["error_type"] == "ValueError", _described(results[0])
    assert "worker 0 built a lookup" in message and "did not build" in message, message
    assert "same sok-ev lookups in the same order" in message, message
    # Worker 1 was waiting in the training exchange: stopped with the cause.
    message = str(results[1]["error"])
    assert results[1]["error_type"] == "InvalidArgumentError", _described(results[1])
    assert "another worker stopped this exchange" in message, message
    assert "different lookups" in message, message
    for rank in range(2):
        assert float(results[rank]["seconds"]) < CHECK_TIMEOUT + SLACK, results[rank]


def test_a_graph_lookup_every_worker_built_but_only_one_runs_fails_on_every_worker_in_time():
    results = _run("eval_built_everywhere_run_on_rank0")
    # Each worker waited in another exchange of t0 (rank 0 the evaluation's,
    # rank 1 the training's); each stopped the other's.
    for rank in range(2):
        message = str(results[rank]["error"])
        assert results[rank]["error_type"] == "InvalidArgumentError", _described(results[rank])
        assert "another worker stopped this exchange" in message, message
        assert "lookup of ['t0:0']" in message, message
        assert float(results[rank]["seconds"]) < CHECK_TIMEOUT + SLACK, results[rank]
    # The watchdog's own message names the lookup that waited and the limit.
    tail = results[0]["launch_tail"]
    assert "in the exchange of the lookup of ['t0:0']" in tail, tail
    assert "which the other workers did not run within" in tail, tail


@pytest.mark.parametrize("scenario", ["saver_save_on_rank0", "checkpoint_save_on_rank0"])
def test_a_save_on_some_workers_only_fails_on_every_worker_within_seconds(scenario):
    results = _run(scenario)
    message = str(results[0]["error"])
    assert results[0]["error_type"] == "ValueError", _described(results[0])
    assert "worker 0 started a" in message and "save that the other workers did not" in message
    assert "every worker saves and restores them" in message, message
    # Worker 1 was waiting in the training exchange: stopped with the cause.
    message = str(results[1]["error"])
    assert results[1]["error_type"] == "InvalidArgumentError", _described(results[1])
    assert "another worker stopped this exchange" in message, message
    for rank in range(2):
        assert float(results[rank]["seconds"]) < CHECK_TIMEOUT + SLACK, results[rank]


def test_a_saver_save_that_fails_on_one_worker_fails_on_every_worker_within_seconds():
    results = _run("saver_write_fails_on_rank1")
    # Worker 1 raises its own error; the others waited in the save graph's
    # collectives for it, and are stopped.
    assert results[1]["save_error_type"] == "NotFoundError", results[1]
    assert "/proc/sok-ev-test/" in str(results[1]["save_error"]), results[1]
    assert results[0]["save_error_type"] == "RuntimeError", results[0]
    assert "another worker's save failed and stopped the job" in str(results[0]["save_error"])
    for rank in range(2):
        assert float(results[rank]["save_seconds"]) < CHECK_TIMEOUT + SLACK, results[rank]


def test_a_saver_save_that_fails_on_every_worker_fails_at_once_and_training_goes_on():
    # A cause every worker shares (the directory is missing): no worker waits
    # for another, so the job is not stopped.
    for rank, got in _run("saver_directory_missing").items():
        assert got["save_error_type"] == "ValueError", got
        assert "Parent directory of" in str(got["save_error"]), got
        assert float(got["save_seconds"]) < SLACK, got
        assert str(got["error"]) == "", _described(got)


def test_a_checkpoint_write_that_fails_on_one_worker_fails_on_every_worker_and_training_goes_on():
    results = _run("checkpoint_write_fails_on_rank1")
    assert results[1]["save_error_type"] == "NotFoundError", results[1]
    assert "/proc/sok-ev-test/" in str(results[1]["save_error"]), results[1]
    # Worker 0 wrote its part, and fails naming worker 1 and its error.
    assert results[0]["save_error_type"] == "NotFoundError", results[0]
    message = str(results[0]["save_error"])
    assert "worker 1 could not write its part of the checkpoint" in message, message
    assert "/proc/sok-ev-test/" in message and "nothing was saved" in message, message
    for rank in range(2):
        assert float(results[rank]["save_seconds"]) < SLACK, results[rank]
        assert str(results[rank]["error"]) == "", _described(results[rank])  # trained on


def test_workers_passing_different_combiners_fail_naming_table_and_combiners():
    for rank, got in _run("different_combiners").items():
        assert got["error_type"] == "ValueError", _described(got)
        message = str(got["error"])
        mine, theirs = ("'sum'", "'mean'") if rank == 0 else ("'mean'", "'sum'")
        assert f"combiner is {mine} on worker {rank}" in message, message
        assert f"but {theirs} on worker {1 - rank}" in message, message
        assert "Embedding Variable 't0" in message and "same combiners" in message, message


def test_a_second_lookup_built_after_training_started_works():
    results = _run("second_lookup")
    for rank, got in results.items():
        assert str(got["error"]) == "", got["error"]
        # The late lookup reads what the training lookup reads, before and after
        # more training steps.
        np.testing.assert_array_equal(got["second"], got["first"])
        np.testing.assert_array_equal(got["second_after"], got["first_after"])
        assert not np.array_equal(got["first"], got["first_after"])  # trained in between
        assert got["new_graph"].shape == (4, 4)
        assert len(got["trained_keys"]) > 0


def test_a_graph_lookup_of_constant_keys_runs_and_reads_what_a_fed_one_reads():
    # Grappler folds constant subgraphs while optimizing; Horovod's alltoall is
    # not marked stateful, so folding the exchange would run a collective at
    # optimization time and leave the workers waiting for each other.
    for rank, got in _run("constant_keys").items():
        assert str(got["error"]) == "", _described(got)
        assert got["constant"].shape == (4, 4)
        np.testing.assert_array_equal(got["constant"], got["fed"])
