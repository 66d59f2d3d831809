"""Fixtures of the pretraining tests."""
import pytest


@pytest.fixture(autouse=True)
def _one_thread_in_pretraining_tests(one_thread):
    """The pretraining models are tiny: every test here runs on one thread."""
    yield
