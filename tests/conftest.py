import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.synthetic import make_upstream  # noqa: E402


@pytest.fixture
def upstream(tmp_path):
    return make_upstream(tmp_path)
