"""Checkpoints of many workers lose nothing, whatever the worker count.

A chain of Horovod launches (checkpoint_worker.py) saves and restores the
same checkpoints through tf.compat.v1.train.Saver, MonitoredTrainingSession
and tf.train.Checkpoint, each worker doing what docs/checkpoints.md's procedure says:

  2 workers train and save  ->  3 workers restore, train, save  ->
  1 worker restores, trains, saves  ->  2 workers restore

so every restore crosses worker counts (2 -> 3, 3 -> 1, 1 -> 2; on two
GPUs, one rank each: 2 -> 1 -> 2, harness.max_workers). After each
restore every key saved is back exactly once, with its row (value and
optimizer slots), frequency and version bit for bit, on the worker that owns
it for the new count (`owner_of`, re-implemented in harness.py), or on the
table's target_gpu worker; the dense variables equal worker 0's. A save
interrupted by a worker's death leaves the previous checkpoint the latest,
and restorable. Four mistakes end in an error on every worker: Saver.save
to a path of each worker's own, tf.train.Checkpoint saved by every worker to
the same path or restored from a different checkpoint on each, and a
restore on worker 0 only followed by a broadcast.
"""
import os
import tempfile

import numpy as np
import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "checkpoint_worker.py")
APIS = ("saver", "monitored", "checkpoint")
# As checkpoint_worker.TABLES: target_gpu of each table ("last" = W - 1).
TARGETS = (-1, 0, "last")
# The worker counts of the chain's launches, in order.
COUNTS = (2, 3, 1, 2) if harness.max_workers() >= 3 else (2, 1, 2)
# (workers, restore, save); the last launch also makes the mistakes.
CHAIN = tuple(
    (workers, f"{COUNTS[i - 1]}w" if i else None, f"{workers}w" if i < len(COUNTS) - 1 else None)
    for i, workers in enumerate(COUNTS))
# The restores of the chain: CHAIN[step - 1] saved what CHAIN[step] restores.
STEPS = range(1, len(CHAIN))


@pytest.fixture(scope="module")
def chain():
    """The launches of CHAIN, in order, sharing one checkpoint root."""
    harness.require_horovodrun()
    root = tempfile.mkdtemp(prefix="sok_ev_checkpoints_")
    launches = []
    for workers, restore, save in CHAIN:
        args = ["--root", root]
        args += ["--restore", restore] if restore else []
        args += ["--save", save] if save else ["--mistakes"]
        result = harness.launch(WORKER, workers, args, timeout=harness.LAUNCH_TIMEOUT)
        assert not result.timed_out, f"{workers} workers timed out:\n{result.tail()}"
        assert result.returncode == 0 and len(result.results) == workers, (
            f"{workers} workers failed (exit {result.returncode}):\n{result.tail()}")
        launches.append((workers, result))
    return launches


def _owner(key, t, workers):
    target = TARGETS[t]
    if target == -1:
        return harness.owner_of(key, workers)
    return workers - 1 if target == "last" else target


def _table(result, workers, prefix, t):
    """{key: (row, frequency, version, worker)} over every worker's shard;
    fails if a key is stored twice."""
    table = {}
    for rank in range(workers):
        data = result.results[rank]
        keys = data[f"{prefix}/t{t}/keys"]
        for i, key in enumerate(keys.tolist()):
            assert key not in table, f"{prefix} table {t}: key {key} on workers " \
                                     f"{table[key][3]} and {rank}"
            table[key] = (data[f"{prefix}/t{t}/rows"][i], data[f"{prefix}/t{t}/frequencies"][i],
                          data[f"{prefix}/t{t}/versions"][i], rank)
    return table


def _assert_restored_exactly(saved_launch, restored_launch, api):
    saved_workers, saved = saved_launch
    workers, restored = restored_launch
    for t in range(len(TARGETS)):
        before = _table(saved, saved_workers, f"{api}/saved", t)
        after = _table(restored, workers, f"{api}/restored", t)
        assert before, f"{api}: table {t} was saved empty"
        assert sorted(after) == sorted(before), f"{api} table {t}: restored keys differ"
        for key, (row, frequency, version, rank) in after.items():
            saved_row, saved_frequency, saved_version, _ = before[key]
            np.testing.assert_array_equal(row, saved_row, err_msg=f"{api} table {t} key {key}")
            assert (frequency, version) == (saved_frequency, saved_version), (api, t, key)
            assert rank == _owner(
                key, t, workers), (f"{api} table {t}: key {key} restored on worker {rank}, owner "
                                   f"{_owner(key, t, workers)} of {workers}")
        slots = {str(restored.results[r][f"{api}/restored/t{t}/slots"]) for r in range(workers)}
        assert slots == {"Adagrad/accumulator"}, f"{api} table {t}: slots {slots}"
    for rank in range(workers):
        np.testing.assert_array_equal(restored.results[rank][f"{api}/restored/bias"],
                                      saved.results[0][f"{api}/saved/bias"])


def _saved_shards_are_on_their_owners(launch, api):
    workers, result = launch
    for t in range(len(TARGETS)):
        for key, (_, _, _, rank) in _table(result, workers, f"{api}/saved", t).items():
            assert rank == _owner(key, t, workers), (api, t, key)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("step", STEPS, ids=[f"{COUNTS[i - 1]}to{COUNTS[i]}" for i in STEPS])
def test_restore_on_another_worker_count_puts_every_key_once_on_its_owner(chain, api, step):
    _saved_shards_are_on_their_owners(chain[step - 1], api)
    _assert_restored_exactly(chain[step - 1], chain[step], api)


def test_broadcasting_optimizer_state_copies_dense_slots_and_leaves_table_slots(chain):
    # checkpoint_worker ran hvd.broadcast_variables(opt.variables(), 0) after
    # training, each worker having trained its bias on a different loss.
    for workers, result in chain[:-1]:
        slots = [result.results[r]["checkpoint/broadcast_dense_slot"] for r in range(workers)]
        for slot in slots[1:]:
            np.testing.assert_array_equal(slot, slots[0])


def test_mistakes_end_in_an_error_on_every_worker(chain):
    workers, result = chain[-1]
    for rank in range(workers):
        data = result.results[rank]
        message = str(data["mistake/saver_paths"])
        assert "different paths on different workers" in message, message
        message = str(data["mistake/restore_on_worker_0_only"])
        assert "restored from a checkpoint on some workers but not on others" in message, message
        assert "t0:0" in message and "t2:0" in message, message
        message = str(data["mistake/checkpoint_same_path"])
        assert "saves to the same path as worker 0" in message, message
        message = str(data["mistake/checkpoint_restore_paths"])
        assert "every worker must restore the same checkpoint" in message, (
            f"worker {rank}: {message}\n--- the launch's output ---\n{result.tail(20000)}")
        assert "tf2_a" in message and "tf2_b" in message, message


def test_an_interrupted_save_leaves_the_previous_checkpoint_restorable():
    harness.require_horovodrun()
    root = tempfile.mkdtemp(prefix="sok_ev_checkpoint_interrupted_")
    interrupted = harness.launch(WORKER,
                                 2, ["--root", root, "--interrupt"],
                                 timeout=harness.LAUNCH_TIMEOUT)
    assert not interrupted.timed_out, interrupted.tail()
    assert interrupted.returncode != 0, "worker 1 was meant to die during the save"
    assert len(interrupted.results) == 2, interrupted.tail()
    # Whether worker 0 got to merge "bad" or not, it never became the latest.
    workers = harness.max_workers()
    resumed = harness.launch(WORKER,
                             workers, ["--root", root, "--restore", "latest", "--apis", "saver"],
                             timeout=harness.LAUNCH_TIMEOUT)
    assert resumed.returncode == 0 and len(resumed.results) == workers, resumed.tail()
    assert str(resumed.results[0]["saver/restored_from"]) == "good"
    _assert_restored_exactly((2, interrupted), (workers, resumed), "saver")
