import pytest
from django.contrib.auth import get_user_model

from chat.services import apikey_create
from knowledge.services import entry_create
from tests.factories import endpoint, rule


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", password="pw-alice-123456")


@pytest.fixture
def bob(db):
    return get_user_model().objects.create_user("bob", password="pw-bob-123456")


@pytest.fixture
def alice_key(alice):
    return apikey_create(user=alice, name="laptop", scopes=["chat"])[1]


@pytest.fixture
def product(local_sim, external_sim):
    """A KB entry, a local and an external endpoint, and a default rule local → external."""
    entry = entry_create(question="How do I reset my password?", answer="Use **Forgot password**.", embed="sync")
    local = endpoint("local", local_sim)
    external = endpoint("external", external_sim, kind="external")
    rule("default", local, external, is_default=True, use_kb_context=False)
    return {"entry": entry, "local": local, "external": external}
