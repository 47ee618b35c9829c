"""The user example python/examples/deeprec_sok_example.py runs and prints the right numbers.

It is run as a user would (a subprocess with this Python). Its three printed
[emb, None, loss] lists must match a NumPy replay of the same model: every
key starts at ones(3), sample 0 holds key 1 twice and sample 1 keys 3, 4, 5,
loss = sum(2 * emb), and Adagrad(0.1) (TF's initial accumulator 0.1) updates
the keys after each step's forward pass.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import sok_ev_reference as ref

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# numpy prints float32 arrays with 8 significant digits; the values go
# through a few float32 Adagrad steps.
RTOL = 1e-5


def test_expected_numbers_start_at_loss_30():
    # Sanity of the replay itself: ones rows -> emb [[2]*3, [3]*3] -> loss 30.
    first_step = ref.example_replay()[:7]
    np.testing.assert_array_equal(first_step, [2, 2, 2, 3, 3, 3, 30])


@pytest.mark.timeout(300)
def test_example_runs_and_prints_adagrad_numbers():
    env = ref.child_env()
    result = subprocess.run([sys.executable, ref.EXAMPLE],
                            cwd=REPO_ROOT,
                            env=env,
                            capture_output=True,
                            text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]

    printed = [float(x) for x in ref.PRINTED_FLOAT.findall(result.stdout)]
    expected = ref.example_replay()
    assert len(printed) == len(expected), result.stdout
    np.testing.assert_allclose(printed, expected, rtol=RTOL, err_msg=result.stdout)
    # The loss falls at every step (sanity beyond the replay).
    losses = printed[6::7]
    assert losses[0] > losses[1] > losses[2]
