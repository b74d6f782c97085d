import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import zlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _data_seeded_by_test(request):
    """The test modules draw their data from module-level generators (`rng`), so a test's data
    used to depend on which tests ran before it in its worker: a failure seen once (a GPU worker
    crash, a float64 Det off by 1e-7) could not be replayed. Every test now starts with every
    loaded test module's `rng` seeded from its own id (file name and parameters), whatever the
    order or the number of workers."""
    seed = zlib.crc32(request.node.nodeid.split("/")[-1].encode())
    for name, mod in list(sys.modules.items()):
        if name.startswith("test_") or name == "oracle":
            if isinstance(getattr(mod, "rng", None), np.random.Generator):
                mod.rng = np.random.default_rng(seed)
    yield


def pytest_addoption(parser):
    parser.addoption("--param-stride", type=int, default=1,
                     help="run every Nth parametrized case of each test function (its first "
                          "always): scripts/test --quick's slice. Default 1: all of them.")


def pytest_collection_modifyitems(config, items):
    """--param-stride N keeps, per test function, its cases 0, N, 2N, ... in collection order, so
    every test function still runs (each case's data does not depend on which others run: see
    _data_seeded_by_test)."""
    stride = config.getoption("--param-stride")
    if stride <= 1:
        return
    seen: dict = {}
    keep, drop = [], []
    for item in items:
        key = (str(item.path), getattr(item, "originalname", item.name))
        i = seen.get(key, 0)
        seen[key] = i + 1
        (keep if i % stride == 0 else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
