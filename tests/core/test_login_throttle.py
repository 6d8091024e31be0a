"""Failed sign-ins are throttled per username and per client address, on the chat login and the
admin login alike, with one message whether the username exists or not."""

import pytest
from django.contrib.auth import get_user_model

THROTTLED = "Too many failed sign-in attempts. Try again in"
WRONG = "correct username and password"

LOGINS = ["/accounts/login/", "/admin/login/"]


@pytest.fixture
def staff_alice(alice):
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    return alice


@pytest.fixture
def limits(settings):
    settings.LOGIN_FAILURES_PER_USERNAME = 3
    settings.LOGIN_FAILURES_PER_ADDRESS = 5
    settings.LOGIN_FAILURE_WINDOW = 900
    return settings


def sign_in(client, url, username, password, address="198.51.100.7"):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.django_db
@pytest.mark.parametrize("url", LOGINS)
def test_after_too_many_failures_even_the_right_password_is_refused_with_a_message(
    client, staff_alice, limits, url
):
    for _ in range(3):
        response = sign_in(client, url, "alice", "wrong")
        assert response.status_code == 200 and WRONG in response.content.decode()

    response = sign_in(client, url, "alice", "pw-alice-123456")

    assert response.status_code == 429 and 0 < int(response["Retry-After"]) <= 900
    assert "Too many failed sign-in attempts. Try again in 15 minutes." in response.content.decode()
    assert not signed_in(client)


@pytest.mark.django_db
def test_failures_on_the_chat_login_also_lock_the_admin_login(client, staff_alice, limits):
    for _ in range(3):
        sign_in(client, "/accounts/login/", "alice", "wrong")

    response = sign_in(client, "/admin/login/", "alice", "pw-alice-123456")

    assert response.status_code == 429 and THROTTLED in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("url", LOGINS)
def test_different_usernames_from_one_address_are_limited_by_the_address_limit(
    client, staff_alice, limits, url
):
    for number in range(5):
        assert (
            sign_in(client, url, f"guess{number}", "wrong", address="203.0.113.9").status_code
            == 200
        )

    refused = sign_in(client, url, "alice", "pw-alice-123456", address="203.0.113.9")
    assert refused.status_code == 429 and THROTTLED in refused.content.decode()
    assert not signed_in(client)

    # Another address is not affected: alice herself signs in from home.
    response = sign_in(client, url, "alice", "pw-alice-123456", address="192.0.2.44")
    assert response.status_code == 302 and signed_in(client)


@pytest.mark.django_db
def test_addresses_in_one_ipv6_network_share_the_address_limit(client, alice, limits):
    for number in range(5):
        sign_in(
            client,
            "/accounts/login/",
            f"guess{number}",
            "wrong",
            address=f"2001:db8:1:2::{number + 1}",
        )

    refused = sign_in(
        client, "/accounts/login/", "alice", "pw-alice-123456", address="2001:db8:1:2:ffff::1"
    )

    assert refused.status_code == 429 and THROTTLED in refused.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("url", LOGINS)
def test_an_unknown_username_gets_the_same_response_as_a_known_one(
    client, staff_alice, limits, url
):
    def attempts(username, address):
        return [sign_in(client, url, username, "wrong", address=address) for _ in range(4)]

    known = attempts("alice", "198.51.100.1")
    unknown = attempts("nobody-by-that-name", "198.51.100.2")

    assert (
        [r.status_code for r in known] == [r.status_code for r in unknown] == [200, 200, 200, 429]
    )
    for known_response, unknown_response in zip(known, unknown, strict=True):
        assert _errors(known_response) == _errors(unknown_response)
    assert THROTTLED in _errors(unknown[-1])


@pytest.mark.django_db
def test_a_successful_sign_in_clears_the_usernames_failures(client, alice, limits):
    for _ in range(2):
        sign_in(client, "/accounts/login/", "alice", "wrong")
    assert sign_in(client, "/accounts/login/", "alice", "pw-alice-123456").status_code == 302
    client.post("/accounts/logout/")

    for _ in range(2):
        sign_in(client, "/accounts/login/", "alice", "wrong")
    response = sign_in(client, "/accounts/login/", "alice", "pw-alice-123456")

    assert response.status_code == 302 and signed_in(client)


@pytest.mark.django_db
def test_the_username_limit_holds_whatever_the_letter_case(client, alice, limits):
    for username in ("alice", "ALICE", "Alice"):
        sign_in(
            client,
            "/accounts/login/",
            username,
            "wrong",
            address=f"192.0.2.{len(username) + ord(username[0])}",
        )

    response = sign_in(
        client, "/accounts/login/", "alice", "pw-alice-123456", address="192.0.2.200"
    )

    assert response.status_code == 429


@pytest.mark.django_db
def test_an_inactive_account_cannot_be_told_apart_while_throttled(client, alice, limits):
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    for _ in range(3):
        sign_in(client, "/accounts/login/", "alice", "pw-alice-123456")

    response = sign_in(client, "/accounts/login/", "alice", "pw-alice-123456")

    assert response.status_code == 429 and THROTTLED in response.content.decode()


def _errors(response) -> str:
    """The form's messages as the user reads them, without the page's per-request tokens."""
    text = response.content.decode()
    start = text.find('role="alert"') if 'role="alert"' in text else text.find("errornote")
    assert start != -1, text
    return text[start : text.find("</", start)]
