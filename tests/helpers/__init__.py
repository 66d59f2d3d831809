"""What several test modules share, imported by name (`from tests.helpers.backends import require`):
no test module imports another, and conftest.py files hold fixtures only."""
