"""Fixtures of the multi-worker tests: one Horovod launch per world size.

`lookup_run(workers)` runs tests/multiworker/lookup_worker.py once per world
size (1, 2 and 3 workers) for every case of `harness.CASES[workers]` and the guard
checks, and caches the result for the session, so the tests of
test_model_parallel.py and test_guards.py share a few launches.
Its rows take the default transport (sok-ev's own NCCL exchange on GPUs,
Horovod on CPUs); `lookup_run(workers, "horovod")` is the same launch with
SOK_EV_ROW_TRANSPORT=horovod.

Launches may run side by side (pytest-xdist, as tests/gpu/run_on_device.sh
runs this folder on the GPUs: `-n N`); each xdist worker then makes the
launches of the fixtures its tests read.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import harness  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope="session")
def lookup_run():
    launches = {}

    def run(workers, row_transport=None):
        harness.require_horovodrun()
        if (workers, row_transport) not in launches:
            launches[workers, row_transport] = harness.launch(
                os.path.join(HERE, "lookup_worker.py"),
                workers, ["--cases", ",".join(harness.CASES[workers])] +
                (["--guards"] if workers == 2 else []),
                timeout=harness.LAUNCH_TIMEOUT,
                env={"SOK_EV_ROW_TRANSPORT": row_transport or ""})
        return launches[workers, row_transport].assert_completed(workers)

    return run
