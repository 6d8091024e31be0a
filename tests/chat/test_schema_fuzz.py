"""The DRF API fuzzed from its own OpenAPI schema (schemathesis with Hypothesis), against a live
daphne with a staff user's key that has every scope: whatever the generated input, no answer is a
server error."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from chat.apikeys import apikey_create
from tests.support.personas import EVERY_VERB, staff_user

pytestmark = pytest.mark.django_db(transaction=True)


def test_no_input_the_schema_allows_or_breaks_is_a_server_error(
    asgi_server, django_user_model, product
):
    staff = staff_user("fuzzer", verbs=EVERY_VERB)  # past the permission checks, into the inputs
    key = apikey_create(user=staff, name="fuzz", scopes=["chat", "kb"])[1]
    schema = schemathesis.openapi.from_url(
        f"{asgi_server}/api/schema/?format=json", headers={"Accept": "application/json"}, timeout=30
    )
    failures, tried, statuses = [], [], []
    for result in schema.get_all_operations():
        operation = result.ok()
        tried.append(operation.label)

        @given(case=operation.as_strategy())
        @settings(
            max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def fuzz(case):
            response = case.call(
                base_url=asgi_server, headers={"Authorization": f"Bearer {key}"}, timeout=30
            )
            statuses.append(response.status_code)
            case.validate_response(response, checks=[not_a_server_error])

        try:
            fuzz()
        except Exception as exc:  # noqa: BLE001 - every operation is tried; all failures are reported
            failures.append(f"{operation.label}: {exc}")
    assert len(tried) >= 10, tried
    assert len(statuses) >= 10 * len(tried)  # each operation was really called, many times
    assert not failures, "\n\n".join(failures)
    print(
        f"{len(statuses)} requests over {len(tried)} operations:",
        {code: statuses.count(code) for code in sorted(set(statuses))},
    )
