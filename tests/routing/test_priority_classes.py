"""Priority classes: set by staff on an API key or a group, shown to the caller in /api/usage, and
passed on to vLLM as `priority` only where the endpoint's engine runs priority scheduling."""

import openai
import pytest
from django.conf import settings
from django.contrib.auth.models import Group

from chat.apikeys import apikey_create, apikey_priority_set
from chat.exceptions import ApiKeyInvalid
from inference_ops.models import EngineProcess
from routing.models import GroupPriority
from tests.spend.test_limits import key_row, usage_of
from tests.support.factories import endpoint, rule
from tests.support.stub_engine import StubEngine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def stub():
    engine = StubEngine().start()
    yield engine
    engine.stop()


def test_usage_shows_the_keys_class_else_the_groups_else_the_default(alice):
    plain = apikey_create(user=alice, name="plain", scopes=["chat"])[1]
    assert usage_of(plain)["priority"] == {
        "class": "api",
        "from": "default for API keys",
        "deadline_seconds": settings.ADMISSION_DEADLINE_API,
    }

    support = Group.objects.create(name="support")
    alice.groups.add(support)
    GroupPriority.objects.create(group=support, priority="interactive")
    assert usage_of(plain)["priority"]["class"] == "interactive"
    assert usage_of(plain)["priority"]["from"] == "your groups"

    nightly = apikey_create(user=alice, name="nightly", scopes=["chat"])[1]
    apikey_priority_set(key=key_row(nightly), priority="batch")
    assert usage_of(nightly)["priority"] == {
        "class": "batch",
        "from": "this API key",
        "deadline_seconds": settings.ADMISSION_DEADLINE_BATCH,
    }


def test_a_class_that_does_not_exist_is_refused(alice):
    raw = apikey_create(user=alice, name="k", scopes=["chat"])[1]
    with pytest.raises(ApiKeyInvalid):
        apikey_priority_set(key=key_row(raw), priority="urgent")


def test_the_engine_gets_the_class_as_priority_only_under_priority_scheduling(
    asgi_server, alice, stub
):
    scheduled = endpoint("scheduled", url=f"{stub.url}/v1")
    plain = endpoint("plain", url=f"{stub.url}/v1")
    EngineProcess.objects.create(
        name="scheduled-1",
        endpoint=scheduled,
        model="acme/local",
        port=18011,
        extra_args=["--scheduling-policy", "priority"],
    )
    rule("default", scheduled, is_default=True, use_kb_context=False)
    rule("plain", plain, priority=10, keywords=["plainly"], use_kb_context=False)
    raw = apikey_create(user=alice, name="desk", scopes=["chat"])[1]
    apikey_priority_set(key=key_row(raw), priority="interactive")
    nightly = apikey_create(user=alice, name="nightly", scopes=["chat"])[1]
    apikey_priority_set(key=key_row(nightly), priority="batch")

    def ask(key, question):
        client = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=key, max_retries=0)
        client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": question}]
        )
        return stub.received[-1]

    assert ask(raw, "hello")["priority"] == 0  # interactive: vLLM's lower goes first
    assert ask(nightly, "hello")["priority"] == 2
    assert "priority" not in ask(raw, "say it plainly")  # a first-come engine would refuse it
