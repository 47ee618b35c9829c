"""Incremental checkpoints of many workers restore what a full save holds.

Two workers (incremental_worker.py) train a sharded table with a
CounterFilter and a table on worker 0, save a full checkpoint with
sok_ev.Saver(incremental_save_restore=True), then three incremental ones,
and a full save by a plain Saver at the last increment's moment. On 2 and
then on 3 workers, restoring the last increment (its chain of parts written
by every worker) gives every worker exactly the shard the full save gives
it, bit for bit, and one more training step on each stays equal (the
filter's counts came back too). On two GPUs (one rank each) the second
restore runs on 1 worker instead of 3.
"""
import tempfile

import numpy as np

import harness

WORKER = __file__.replace("test_incremental_chain.py", "incremental_worker.py")


def _assert_restores_equal(result, workers):
    assert not result.timed_out, f"{workers} workers timed out:\n{result.tail()}"
    assert result.returncode == 0 and len(result.results) == workers, (
        f"{workers} workers failed (exit {result.returncode}):\n{result.tail()}")
    for rank, arrays in result.results.items():
        for name, value in arrays.items():
            if not name.startswith("incr/"):
                continue
            np.testing.assert_array_equal(value,
                                          arrays["ref/" + name[len("incr/"):]],
                                          err_msg=f"{workers} workers, rank {rank}: {name}")
        # t1 lives whole on worker 0; every worker owns some keys of t0.
        assert (len(arrays["ref/restored/t1/keys"]) > 0) == (rank == 0)
        assert len(arrays["ref/restored/t0/keys"]) > 0


def test_incremental_chain_restores_every_workers_shard_bit_for_bit_on_2_then_another_count():
    harness.require_horovodrun()
    root = tempfile.mkdtemp(prefix="sok_ev_incremental_")
    saved = harness.launch(WORKER, 2, ["--root", root, "--save"], timeout=harness.LAUNCH_TIMEOUT)
    _assert_restores_equal(saved, 2)
    workers = 3 if harness.max_workers() >= 3 else 1
    restored = harness.launch(WORKER, workers, ["--root", root], timeout=harness.LAUNCH_TIMEOUT)
    _assert_restores_equal(restored, workers)
