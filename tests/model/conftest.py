"""Fixtures of the model tests."""
import pytest

from tests.helpers.fine_tuning import sentiment_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    """The toy sentiment task's tokenizer (tests.helpers.fine_tuning), once a module."""
    return sentiment_tokenizer()
