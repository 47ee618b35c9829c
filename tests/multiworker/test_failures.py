"""Failures end every worker in bounded time, with a clear message.

* Mismatch: workers that built different tables (or chose different
  exchange dtypes or, on GPUs, row transports) fail at the first lookup,
  every one of them, with a ValueError naming the table, the field and both
  values -- before any exchange that could hang.
* Time limit: when a rank dies, horovodrun stops the others; when a rank
  hangs, every rank prints its stacks at its deadline and the job ends
  (harness.arm_rank_deadline); should that fail, the harness kills the
  whole process group at its time limit.
* On GPUs with SOK_EV_ROW_TRANSPORT=nccl, a worker that stops between a
  lookup's key exchange and its row exchange fails the others' row exchange
  after SOK_EV_EXCHANGE_TIMEOUT seconds, naming the setting.
"""
import os
import time

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))


def test_mismatched_tables_fail_clearly_on_every_worker():
    harness.require_horovodrun()
    result = harness.launch(os.path.join(HERE, "mismatch_worker.py"), 2, timeout=120)
    assert result.returncode == 0 and len(result.results) == 2, result.tail()
    for rank, other in ((0, 1), (1, 0)):
        mine, theirs = (4, 8) if rank == 0 else (8, 4)
        message = str(result.results[rank]["dim"])
        assert "Embedding Variable 't1:0'" in message, message
        assert (f"embedding_dim is {mine} on worker {rank} but {theirs} on "
                f"worker {other}") in message, message
        mine, theirs = (-1, 0) if rank == 0 else (0, -1)
        message = str(result.results[rank]["target_gpu"])
        assert "Embedding Variable 't2:0'" in message, message
        assert (f"target_gpu is {mine} on worker {rank} but {theirs} on "
                f"worker {other}") in message, message
        mine, theirs = ("float16", "bfloat16") if rank == 0 else ("bfloat16", "float16")
        message = str(result.results[rank]["exchange_dtype"])
        assert (f"exchange_dtype of the lookup of ['t3:0'] is '{mine}' on worker {rank}"
                in message), message
        assert f"but '{theirs}' on worker {other}" in message, message
        if harness.GPUS:  # CPU workers refuse the native transport before the check
            mine, theirs = ("horovod", "nccl") if rank == 0 else ("nccl", "horovod")
            message = str(result.results[rank]["row_transport"])
            assert (f"row_transport of the lookup of ['t4:0'] is '{mine}' on worker {rank}"
                    in message), message
            assert f"but '{theirs}' on worker {other}" in message, message
            assert "every worker must set the same SOK_EV_ROW_TRANSPORT" in message, message


def test_a_dying_worker_stops_the_job():
    harness.require_horovodrun()
    result = harness.launch(os.path.join(HERE, "stuck_worker.py"),
                            2, ["--fault", "die"],
                            timeout=120)
    assert not result.timed_out, result.tail()
    assert result.returncode != 0


def test_a_hanging_worker_prints_every_ranks_stack_and_ends_the_job_at_its_deadline():
    harness.require_horovodrun()
    limit = 60
    # Rank 0 waits for rank 1 in the lookup's build-time check; its own time
    # limit is set past the ranks' deadline, so the deadline ends the job.
    result = harness.launch(os.path.join(HERE, "stuck_worker.py"),
                            2, ["--fault", "hang"],
                            timeout=limit,
                            env={"SOK_EV_LOOKUP_CHECK_TIMEOUT": "600"})
    # The job ended itself, before the harness's kill at `limit`.
    assert not result.timed_out, result.tail()
    assert result.returncode != 0, result.tail()
    assert result.stuck_ranks() == {0, 1}, result.tail(20000)
    # Each rank's stack shows where it waited: rank 1 in its sleep.
    rank1_stderr = "\n".join(
        line for line in result.output.splitlines() if line.startswith("[1]<stderr>:"))
    assert 'stuck_worker.py", line' in rank1_stderr and "in main" in rank1_stderr, rank1_stderr


def test_a_hanging_worker_is_killed_at_the_time_limit():
    """The harness's own kill, for a rank whose deadline did not end it."""
    harness.require_horovodrun()
    limit = 15
    start = time.monotonic()
    result = harness.launch(os.path.join(HERE, "stuck_worker.py"),
                            2, ["--fault", "hang"],
                            timeout=limit,
                            env={harness.RANK_DEADLINE_VARIABLE: "3600"})
    assert result.timed_out
    assert time.monotonic() - start < limit + 15
    for _ in range(20):  # killed ranks may take a moment to be reaped
        if "stuck_worker.py" not in os.popen("ps -eo args").read():
            break
        time.sleep(0.5)
    else:
        raise AssertionError("a rank survived the time limit")


def test_a_worker_stopped_between_key_and_row_exchange_fails_the_others_at_the_timeout():
    if not harness.GPUS:
        pytest.skip("the native row exchange runs between GPUs; CPU workers refuse it "
                    "(test_native_exchange_workers.py)")
    harness.require_horovodrun()
    timeout = 8
    start = time.monotonic()
    result = harness.launch(os.path.join(HERE, "stuck_worker.py"),
                            2, ["--fault", "hang-between-exchanges"],
                            timeout=120,
                            env={
                                "SOK_EV_ROW_TRANSPORT": "nccl",
                                "SOK_EV_EXCHANGE_TIMEOUT": str(timeout)
                            })
    assert not result.timed_out, result.tail()
    assert result.returncode != 0, result.tail()
    rank0 = harness.rank_stdout(result.output, 0)
    assert "[rank 0] first step done" in rank0, result.tail()
    assert (f"an all-to-all did not end within {timeout} s (SOK_EV_EXCHANGE_TIMEOUT)"
            in rank0), result.tail()
    # The first step, the timeout, and horovodrun stopping rank 1: seconds.
    assert time.monotonic() - start < 100, result.tail()
