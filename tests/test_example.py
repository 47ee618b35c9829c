"""The user example python/examples/deeprec_sok_example.py runs and prints the right numbers.

It is run as a user would (a subprocess with this Python). Its three printed
[emb, None, loss] lists must match a NumPy replay of the same model: every
key starts at ones(3), sample 0 holds key 1 twice and sample 1 keys 3, 4, 5,
loss = sum(2 * emb), and Adagrad(0.1) (TF's initial accumulator 0.1) updates
the keys after each step's forward pass.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO_ROOT, "python", "examples", "deeprec_sok_example.py")
FLOAT = re.compile(r"[-+]?\d+\.\d*(?:[eE][-+]?\d+)?")  # '2.', '30.0', '1.8006e+00'

# numpy prints float32 arrays with 8 significant digits; the values go
# through a few float32 Adagrad steps.
RTOL = 1e-5


def expected_prints(steps=3, lr=0.1, initial_accumulator=0.1):
    samples = [[1, 1], [3, 4, 5]]
    value = {k: np.ones(3) for k in (1, 3, 4, 5)}
    accum = {k: np.full(3, initial_accumulator) for k in value}
    prints = []
    for _ in range(steps):
        emb = np.stack([sum(value[k] for k in sample) for sample in samples])
        prints.append((emb, 2.0 * emb.sum()))
        grad = {k: np.zeros(3) for k in value}
        for sample in samples:
            for k in sample:
                grad[k] += 2.0  # d loss / d emb = 2 for every element
        for k, g in grad.items():
            accum[k] += g * g
            value[k] -= lr * g / np.sqrt(accum[k])
    return prints


def test_expected_numbers_start_at_loss_30():
    # Sanity of the replay itself: ones rows -> emb [[2]*3, [3]*3] -> loss 30.
    emb, loss = expected_prints()[0]
    np.testing.assert_array_equal(emb, [[2, 2, 2], [3, 3, 3]])
    assert loss == 30.0


@pytest.mark.timeout(300)
def test_example_runs_and_prints_adagrad_numbers():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO_ROOT, env.get("PYTHONPATH")] if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run([sys.executable, EXAMPLE], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]

    printed = [float(x) for x in FLOAT.findall(result.stdout)]
    expected = []
    for emb, loss in expected_prints():
        expected += emb.reshape(-1).tolist() + [loss]
    assert len(printed) == len(expected), result.stdout
    np.testing.assert_allclose(printed, expected, rtol=RTOL, err_msg=result.stdout)
    # The loss falls at every step (sanity beyond the replay).
    losses = printed[6::7]
    assert losses[0] > losses[1] > losses[2]
