import os

import pytest
import torch

# Tests are deterministic and CPU-only; two threads match the CI machine.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
