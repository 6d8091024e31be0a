"""Who may do what: every URL and socket of the product against every kind of caller, through
the real ASGI application under daphne (HTTP) and the real ASGI application with the Redis
channel layer (sockets). A new URL fails `test_every_url_is_in_the_matrix` until it is placed."""

import secrets
import urllib.error
import urllib.request

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from chat.models import ChatSession
from chat.services import apikey_create, apikey_revoke
from knowledge.services import entry_create
from tests.factories import endpoint, rule

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = ("anonymous", "user", "other user", "staff", "superuser")
KEYS = ("chat key", "chat key of staff", "kb key of staff", "kb key of ex-staff", "key of inactive user", "revoked key")
CALLERS = SESSIONS + KEYS

SAME = "the same as anonymous"  # a status that depends on the machine, not on the caller


def row(anonymous, user, other, staff, superuser, chat_key, chat_staff, kb_staff, kb_ex_staff, inactive, revoked):
    return dict(zip(CALLERS, (anonymous, user, other, staff, superuser, chat_key, chat_staff, kb_staff, kb_ex_staff,
                              inactive, revoked)))


# (method, path, JSON body) → the status each caller gets. None: not asked (it would change the data
# the other rows need). {S} and {K} are the user's chat session and API key, {E} a KB entry.
# Pages answer a key with the login redirect (keys are for APIs); APIs answer a missing or bad
# key with 401, a caller without the right with 403, another user's object with 404.
MATRIX = {
    ("GET", "/", None): row(302, 200, 200, 200, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/keys/", None): row(302, 200, 200, 200, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/accounts/login/", None): row(200, 302, 302, 302, 302, 200, 200, 200, 200, 200, 200),
    ("GET", "/accounts/logout/", None): row(405, 405, 405, 405, 405, 405, 405, 405, 405, 405, 405),
    ("GET", "/healthz", None): row(200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200),
    # No METRICS_TOKEN and DEBUG off: nobody scrapes, whoever they are logged in as.
    ("GET", "/metrics", None): row(403, 403, 403, 403, 403, 403, 403, 403, 403, 403, 403),
    # The request log needs its own view permission, which the curator (staff of the KB, rules and
    # engines) was not given.
    ("GET", "/admin/chat/requestlog/dashboard/", None): row(302, 302, 302, 403, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/admin/chat/requestlog/export.csv", None): row(302, 302, 302, 403, 200, 302, 302, 302, 302, 302, 302),
    # 200 or 503 by whether a Celery worker runs (another test may have started one): the same for all.
    ("GET", "/readyz", None): row(*[SAME] * 11),
    ("GET", "/admin/", None): row(302, 302, 302, 200, 200, 302, 302, 302, 302, 302, 302),
    # The admin's sign-in page (its own URL: throttled failures answer 429); staff are sent on.
    ("GET", "/admin/login/", None): row(200, 200, 200, 302, 302, 200, 200, 200, 200, 200, 200),
    ("GET", "/admin/knowledge/entry/", None): row(302, 302, 302, 200, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/admin/auth/user/", None): row(302, 302, 302, 403, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/admin/routing/routingrule/add/", None): row(302, 302, 302, 200, 200, 302, 302, 302, 302, 302, 302),
    # Rows that reach the host or send data to a URL: superusers edit, staff may look.
    ("GET", "/admin/knowledge/embeddingmodel/add/", None):
        row(302, 302, 302, 403, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/admin/knowledge/embeddingmodel/", None): row(302, 302, 302, 200, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/admin/inference_ops/engineprocess/add/", None):
        row(302, 302, 302, 403, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/admin/inference_ops/modelendpoint/add/", None):
        row(302, 302, 302, 403, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/admin/inference_ops/modelendpoint/", None): row(302, 302, 302, 200, 200, 302, 302, 302, 302, 302, 302),
    ("GET", "/api/kb/entries/", None): row(401, 403, 403, 200, 200, 403, 403, 200, 403, 401, 401),
    ("GET", "/api/kb/entries/{E}/", None): row(401, 403, 403, 200, 200, 403, 403, 200, 403, 401, 401),
    ("GET", "/api/kb/search?q=refund", None): row(401, 403, 403, 200, 200, 403, 403, 200, 403, 401, 401),
    ("GET", "/api/kb/answer?q=refund", None):
        row(401, 403, 403, 200, 200, 403, 403, 200, 403, 401, 401),
    ("POST", "/api/routing/explain", '{"text": "What is the refund policy?"}'):
        row(401, 403, 403, 200, 200, 403, 403, 200, 403, 401, 401),
    ("GET", "/api/chat/sessions/", None): row(401, 200, 200, 200, 200, 200, 200, 403, 403, 401, 401),
    ("GET", "/api/chat/sessions/{S}/", None): row(401, 200, 404, 404, 404, 200, 404, 403, 403, 401, 401),
    ("GET", "/api/chat/sessions/{S}/messages/", None): row(401, 200, 404, 404, 404, 200, 404, 403, 403, 401, 401),
    ("POST", "/api/chat/sessions/{S}/messages/stream", '{"content": "What is the refund policy?"}'):
        row(401, 200, 404, 404, 404, 200, 404, 403, 403, 401, 401),
    ("GET", "/api/keys/", None): row(401, 200, 200, 200, 200, 403, 403, 403, 403, 401, 401),
    ("DELETE", "/api/keys/{K}/", None): row(401, None, 404, 404, 404, 403, 403, 403, 403, 401, 401),
    ("GET", "/api/schema/", None): row(200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "/api/docs/", None): row(200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "/v1/models", None): row(401, 401, 401, 401, 401, 200, 200, 403, 403, 401, 401),
    ("POST", "/v1/chat/completions",
     '{"model": "auto", "messages": [{"role": "user", "content": "What is the refund policy?"}]}'):
        row(401, 401, 401, 401, 401, 200, 200, 403, 403, 401, 401),
}

# The sockets: accepted, or closed with the code the page shows. Keys do not open sockets.
SOCKETS = {
    "/ws/chat/": dict(zip(SESSIONS, ("closed 4401", "accepted", "accepted", "accepted", "accepted"))),
    "/ws/ops/": dict(zip(SESSIONS, ("closed 4403", "closed 4403", "closed 4403", "accepted", "accepted"))),
}


@pytest.fixture
def world(django_user_model, local_sim):
    users = {
        "user": django_user_model.objects.create_user("alice", password="pw-alice-123456"),
        "other user": django_user_model.objects.create_user("bob", password="pw-bob-123456"),
        "staff": django_user_model.objects.create_user("carol", password="pw-carol-123456", is_staff=True),
        "superuser": django_user_model.objects.create_superuser("root", password="pw-root-123456"),
    }
    curator = users["staff"]
    # Every permission of the product's apps: what staff may still not do is the product's rule.
    curator.user_permissions.set(Permission.objects.filter(
        content_type__app_label__in=["knowledge", "routing", "inference_ops"]))
    entry = entry_create(question="What is the refund policy?", answer="Refunds within 30 days.", embed="sync")
    rule("default", endpoint("local", local_sim), is_default=True, use_kb_context=False)
    session = ChatSession.objects.create(user=users["user"], title="mine")
    chat_key, chat_raw = apikey_create(user=users["user"], name="laptop", scopes=["chat"])
    revoked, revoked_raw = apikey_create(user=users["user"], name="old", scopes=["chat"])
    apikey_revoke(key=revoked)
    demoted = django_user_model.objects.create_user("dave", password="pw-dave-123456", is_staff=True)
    ex_staff_raw = apikey_create(user=demoted, name="curation", scopes=["kb"])[1]
    demoted.is_staff = False
    demoted.save()
    gone = django_user_model.objects.create_user("eve", password="pw-eve-123456")
    inactive_raw = apikey_create(user=gone, name="laptop", scopes=["chat"])[1]
    gone.is_active = False
    gone.save()
    keys = {
        "chat key": chat_raw,
        "chat key of staff": apikey_create(user=curator, name="laptop", scopes=["chat"])[1],
        "kb key of staff": apikey_create(user=curator, name="curation", scopes=["kb"])[1],
        "kb key of ex-staff": ex_staff_raw,
        "key of inactive user": inactive_raw,
        "revoked key": revoked_raw,
    }
    cookies = {}
    for name, user in users.items():
        client = Client()
        client.force_login(user)
        cookies[name] = client.cookies["sessionid"].value
    return {"users": users, "cookies": cookies, "keys": keys,
            "ids": {"S": session.pk, "K": chat_key.pk, "E": entry.pk}}


def _request(base, method, path, body, *, cookie=None, key=None, headers=None) -> int:
    headers = {"Accept": "*/*", **(headers or {})}
    data = None
    if body is not None:
        data, headers["Content-Type"] = body.encode(), "application/json"
    if cookie:
        csrf = secrets.token_hex(16)  # a session's unsafe methods need the CSRF cookie and header
        headers.update({"Cookie": f"sessionid={cookie}; csrftoken={csrf}", "X-CSRFToken": csrf})
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_every_caller_gets_what_its_role_allows_on_every_url(asgi_server, world):
    got, expected = {}, {}
    for (method, template, body), outcomes in MATRIX.items():
        path = template.format(**world["ids"])
        for caller, status in outcomes.items():
            if status is None:
                continue
            credentials = ({"cookie": world["cookies"].get(caller)} if caller in SESSIONS
                           else {"key": world["keys"][caller]})
            got[(method, template, caller)] = _request(asgi_server, method, path, body, **credentials)
            expected[(method, template, caller)] = status
    for (method, template, caller), status in expected.items():
        if status == SAME:
            expected[(method, template, caller)] = got[(method, template, "anonymous")]
    wrong = {k: f"got {got[k]}, expected {expected[k]}" for k in expected if got[k] != expected[k]}
    assert wrong == {}, "\n".join(f"{k}: {v}" for k, v in sorted(wrong.items()))


async def _socket(path, cookie) -> str:
    from config.asgi import application

    headers = [(b"host", b"testserver"), (b"origin", b"http://testserver")]
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    socket = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await socket.connect(timeout=10)
    await socket.disconnect()
    return "accepted" if connected else f"closed {code}"


def test_the_public_docs_ignore_a_bad_key_instead_of_failing(asgi_server, world):
    """A revoked key on the docs page, asking for JSON, was a 500 (the page's template asked for
    the user, which raised)."""
    revoked = {"Accept": "application/json", "Authorization": f"Bearer {world['keys']['revoked key']}"}
    assert _request(asgi_server, "GET", "/api/schema/", None, headers=revoked) == 200
    assert _request(asgi_server, "GET", "/api/docs/", None, headers=revoked) == 406  # an HTML page only


def test_every_socket_admits_only_its_callers(world):
    got = {(path, caller): async_to_sync(_socket)(path, world["cookies"].get(caller))
           for path, outcomes in SOCKETS.items() for caller in outcomes}
    expected = {(path, caller): outcome for path, outcomes in SOCKETS.items() for caller, outcome in outcomes.items()}
    assert {k: got[k] for k in expected if got[k] != expected[k]} == {}


def _paths(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if str(pattern.pattern) == "admin/":
                yield "/admin/"  # the admin's own pages: covered by its rows above and its own checks
                continue
            yield from _paths(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield "/" + prefix + str(pattern.pattern)


def test_every_url_is_in_the_matrix():
    placed = {template.split("?")[0].replace("{S}", "<int:pk>").replace("{K}", "<int:pk>").replace("{E}", "<int:pk>")
              for _, template, _ in MATRIX}
    placed.add("/")
    routes = set(_paths(get_resolver().url_patterns))
    assert routes - placed == set()
