import pytest

from knowledge.services import entry_create
from tests.support.factories import endpoint, rule


@pytest.fixture
def product(local_sim, external_sim):
    """A KB entry, a local and an external endpoint, and a default rule local → external."""
    entry = entry_create(
        question="How do I reset my password?", answer="Use **Forgot password**.", embed="sync"
    )
    local = endpoint("local", local_sim)
    external = endpoint("external", external_sim, kind="external")
    rule("default", local, external, is_default=True, use_kb_context=False)
    return {"entry": entry, "local": local, "external": external}
