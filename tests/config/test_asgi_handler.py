"""config.handlers under daphne: request threads are reused, and nothing of one request reaches
the next."""

import json
import threading
import urllib.error
import urllib.request

import pytest
from django.contrib.auth import get_user_model

from chat.apikeys import apikey_create
from chat.models import ChatSession

pytestmark = pytest.mark.django_db(transaction=True)


def _get(url, key=None, cookie=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_interleaved_requests_of_two_users_each_see_only_their_own_data(asgi_server):
    users = {}
    for name in ("carol", "dave"):
        user = get_user_model().objects.create_user(name, password=f"pw-{name}-123456")
        ChatSession.objects.create(user=user, title=f"{name}'s session")
        users[name] = apikey_create(user=user, name="cli", scopes=["chat"])[1]
    seen, failures = [], []

    def ask(name, key):
        for _ in range(15):
            status, body = _get(f"{asgi_server}/api/chat/sessions/", key)
            if status != 200:
                failures.append((name, status, body))
                continue
            seen.append((name, tuple(session["title"] for session in body["results"])))
        status, body = _get(
            f"{asgi_server}/api/chat/sessions/"
        )  # no key: the thread keeps no identity
        if status != 401:
            failures.append(("anonymous", status, body))

    # More requests than idle threads exist at first, from both users at once and one after another.
    workers = [threading.Thread(target=ask, args=item) for item in list(users.items()) * 4]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not failures
    assert len(seen) == 8 * 15
    assert {titles for name, titles in seen if name == "carol"} == {("carol's session",)}
    assert {titles for name, titles in seen if name == "dave"} == {("dave's session",)}


def test_a_failed_request_leaves_its_thread_fit_for_the_next(asgi_server):
    user = get_user_model().objects.create_user("erin", password="pw-erin-123456")
    key = apikey_create(user=user, name="cli", scopes=["chat"])[1]
    for _ in range(5):
        status, body = _get(f"{asgi_server}/api/chat/sessions/999999/", key)
        assert status == 404 and body["error"]["code"] == "not_found"
        status, body = _get(f"{asgi_server}/api/chat/sessions/", f"{key}x")
        assert status == 401
        status, body = _get(f"{asgi_server}/api/chat/sessions/", key)
        assert status == 200 and body["results"] == []
