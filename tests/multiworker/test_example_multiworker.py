"""The user example runs under `horovodrun -np 2 --gloo` and every rank
prints the same numbers: those of a NumPy replay in which both workers feed
the example's batch, so each key's gradient is summed over the 2 workers by
its owner before Adagrad(0.1) applies it.
"""
import os
import re

import numpy as np
import pytest

import harness

EXAMPLE = os.path.join(harness.REPO_ROOT, "python", "examples",
                       "deeprec_sok_example.py")
FLOAT = re.compile(r"[-+]?\d+\.\d*(?:[eE][-+]?\d+)?")
RTOL = 1e-5  # numpy prints 8 significant digits of float32 values


def expected_numbers(workers, steps=3, lr=0.1, initial_accumulator=0.1):
    """[emb (6 floats), mean loss] per step, flattened."""
    samples = [[1, 1], [3, 4, 5]]
    value = {k: np.ones(3) for k in (1, 3, 4, 5)}
    accum = {k: np.full(3, initial_accumulator) for k in value}
    numbers = []
    for _ in range(steps):
        emb = np.stack([sum(value[k] for k in sample) for sample in samples])
        numbers += emb.reshape(-1).tolist() + [2.0 * emb.sum()]
        grad = {k: np.zeros(3) for k in value}
        for sample in samples:
            for k in sample:
                grad[k] += 2.0 * workers  # every worker feeds the sample
        for k, g in grad.items():
            accum[k] += g * g
            value[k] -= lr * g / np.sqrt(accum[k])
    return numbers


@pytest.mark.parametrize("target_gpu", [-1, 1])
def test_example_on_two_workers(target_gpu):
    harness.require_horovodrun()
    result = harness.launch(EXAMPLE, 2, ["--target_gpu", target_gpu],
                            timeout=180, pass_out=False)
    assert result.returncode == 0, result.tail()
    expected = expected_numbers(workers=2)
    for rank in range(2):
        printed = [float(x) for x in
                   FLOAT.findall(harness.rank_stdout(result.output, rank))]
        assert len(printed) == len(expected), result.tail()
        np.testing.assert_allclose(printed, expected, rtol=RTOL,
                                   err_msg=f"rank {rank}")
