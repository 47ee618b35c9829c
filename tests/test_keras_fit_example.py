"""python/examples/keras_fit_example.py (a DLRM of sok_ev.keras layers on
synthetic Criteo-shaped data, trained by fit) runs briefly as a user runs
it: it trains (the held-out AUC beats chance, the logloss beats the
constant predictor's on balanced-ish labels), writes its checkpoint and a
SavedModel export for serving."""
import os
import re
import subprocess
import sys

import sok_ev_reference as ref

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO_ROOT, "python", "examples", "keras_fit_example.py")


def test_keras_fit_example_trains_saves_and_exports(tmp_path):
    env = ref.child_env()
    result = subprocess.run([
        sys.executable, EXAMPLE, "--steps", "60", "--batch", "256", "--out",
        str(tmp_path / "out"), "--export",
        str(tmp_path / "export")
    ],
                            cwd=str(tmp_path),
                            env=env,
                            capture_output=True,
                            text=True,
                            timeout=600,
                            check=False)
    assert result.returncode == 0, result.stderr[-6000:]
    found = re.search(r"eval logloss ([\d.]+) auc ([\d.]+) \((\d+) keys", result.stdout)
    assert found, result.stdout
    logloss, auc, keys = float(found[1]), float(found[2]), int(found[3])
    assert auc > 0.55, result.stdout
    assert logloss < 0.693, result.stdout  # log(2): predicting one half
    assert keys > 1000, "the tables did not grow as ids arrived"
    assert os.path.exists(tmp_path / "out" / "worker-0" / "ckpt.index")
    assert os.path.exists(tmp_path / "export" / "saved_model.pb")
