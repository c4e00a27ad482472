"""The runner seeds as transformers.set_seed did, without importing transformers.trainer_utils.

The rank's "model" phase on the lent H100 spent 11.5 s importing trainer_utils (and peft through
it) for ``set_seed`` alone; runners/common.seed_all makes the same calls, so a batch's initial
weights (and the parity baseline's) are what they were.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from helpers import IMPORTS_DEEPSPEED

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runners"))

import common  # noqa: E402

pytestmark = IMPORTS_DEEPSPEED


def _states() -> tuple:
    import numpy as np
    import torch

    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


@pytest.mark.parametrize("seed", [0, 42, 2**31 - 1])
def test_seed_all_leaves_every_generator_as_set_seed_does(seed: int) -> None:
    import torch
    from transformers import set_seed

    set_seed(seed)
    want, w_init = _states(), torch.nn.Linear(64, 64).weight.detach().clone()
    random.seed(seed + 1)  # disturb, so a no-op could not pass
    torch.manual_seed(seed + 1)
    common.seed_all(seed)
    got, g_init = _states(), torch.nn.Linear(64, 64).weight.detach().clone()
    assert got == want
    assert torch.equal(g_init, w_init)


def test_no_runner_seeds_through_transformers() -> None:
    """A rank's seeding goes through common.seed_all; transformers.set_seed would import peft again."""
    users = [p.name for p in (REPO / "runners").glob("*.py") if "transformers.set_seed" in p.read_text()]
    users += [p.name for p in (REPO / "runners").glob("*.py") if "from transformers import set_seed" in p.read_text()]
    assert users == []
