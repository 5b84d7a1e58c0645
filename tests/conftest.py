"""Shared test setup: deterministic seeds, a derandomised hypothesis profile, tolerances."""

from __future__ import annotations

import os
import random

import pytest
import torch
from hypothesis import HealthCheck, settings

# Derandomised everywhere: a flaky property test would keep a submission from landing.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
