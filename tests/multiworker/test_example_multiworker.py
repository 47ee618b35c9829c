"""The user example runs under `horovodrun -np 2 --gloo` and every rank
prints the same numbers: those of a NumPy replay in which both workers feed
the example's batch, so each key's gradient is summed over the 2 workers by
its owner before Adagrad(0.1) applies it.
"""
import numpy as np
import pytest

import harness
import sok_ev_reference as ref

RTOL = 1e-5  # numpy prints 8 significant digits of float32 values


@pytest.mark.parametrize("target_gpu", [-1, 1])
def test_example_on_two_workers(target_gpu):
    harness.require_horovodrun()
    result = harness.launch(ref.EXAMPLE,
                            2, ["--target_gpu", target_gpu],
                            timeout=180,
                            pass_out=False)
    assert result.returncode == 0, result.tail()
    expected = ref.example_replay(workers=2)
    for rank in range(2):
        printed = [
            float(x) for x in ref.PRINTED_FLOAT.findall(harness.rank_stdout(result.output, rank))
        ]
        assert len(printed) == len(expected), result.tail()
        np.testing.assert_allclose(printed, expected, rtol=RTOL, err_msg=f"rank {rank}")
