"""The chat tests' API clients: alice's and bob's, signed in."""

import pytest
from rest_framework.test import APIClient


@pytest.fixture
def api(alice):
    client = APIClient()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_api(bob):
    client = APIClient()
    client.force_login(bob)
    return client
