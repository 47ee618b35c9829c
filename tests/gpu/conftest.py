"""GPU tests: skipped cleanly where torch, a CUDA GPU or the built harness
library (cc/gpu_harness/build.sh) is missing, e.g. on the CPU CI."""
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "cc", "gpu_harness"))

from sokev_gpu_reference import SKIP_REASON  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON is None:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    marker = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(marker)
