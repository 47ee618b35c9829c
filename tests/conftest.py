"""Fixtures for the single-worker CPU test suite (tests/*.py).

* `sok`: the sok_ev package, initialised once (sok_ev.init() is idempotent
  and installs the optimizer hook every optimizer test relies on).
* `rng`: a NumPy Generator seeded per test from the test's id, so each test
  gets its own random data, and a failure reproduces on rerun. Set
  SOK_EV_TEST_SEED to draw a different data set for the whole suite.
* `unique_name`: EV names that do not collide across tests (eager EVs live
  for the whole process).

Shared reference computations live in tests/sok_ev_reference.py. The run's
header names the sok_ev package and op library under test.
"""
import hashlib
import importlib.util
import json
import os
import re
import sys
import zlib

import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Prefer an installed sok_ev; fall back to the in-tree package (built in place).
if REPO_ROOT not in sys.path:
    sys.path.append(REPO_ROOT)

BASE_SEED = int(os.environ.get("SOK_EV_TEST_SEED", "0"))


def pytest_report_header(config):
    # Which sok_ev these tests run (the checkout or an installed wheel), read
    # without importing it.
    spec = importlib.util.find_spec("sok_ev")
    if spec is None:
        return "sok_ev under test: none importable"
    package = os.path.dirname(spec.origin)
    library = os.path.join(package, "_sok_ev_ops.so")
    digest = "missing"
    if os.path.exists(library):
        with open(library, "rb") as f:
            digest = "sha256 " + hashlib.sha256(f.read()).hexdigest()[:16]
    info_path = os.path.join(package, "_build_info.json")
    info = "no _build_info.json"
    if os.path.exists(info_path):
        with open(info_path) as f:
            info = json.dumps(json.load(f), sort_keys=True)
    return [f"sok_ev under test: {spec.origin}", f"sok_ev op library: {library} ({digest}) {info}"]


@pytest.fixture(scope="session")
def sok():
    import sok_ev

    sok_ev.init()
    return sok_ev


@pytest.fixture
def seed(request):
    return zlib.crc32(request.node.nodeid.encode()) ^ BASE_SEED


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


@pytest.fixture
def unique_name(request):
    stem = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:60]
    counter = iter(range(1_000_000))
    return lambda tag="ev": f"{stem}_{tag}_{next(counter)}"


def pytest_runtest_makereport(item, call):
    # Print the data seed of a failing test, to reproduce it exactly.
    if call.when == "call" and call.excinfo is not None and "seed" in item.fixturenames:
        item.add_report_section(
            "call", "seed", f"SOK_EV_TEST_SEED={BASE_SEED}, "
            f"test seed={zlib.crc32(item.nodeid.encode()) ^ BASE_SEED}")
