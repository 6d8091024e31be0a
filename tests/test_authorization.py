"""Who may do what: every URL and socket of the product against every kind of caller, through
the real ASGI application under daphne (HTTP) and the real ASGI application with the Redis
channel layer (sockets); every admin page and admin action against every kind of staff, in
process. A new URL fails `test_every_url_is_in_the_matrix`, a new admin model or action
`test_every_admin_model_and_action_is_in_the_matrix`, until it is placed."""

import re
import secrets
import urllib.error
import urllib.request
import uuid

import pytest
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.contrib.auth.models import Group
from django.contrib.messages import get_messages
from django.test import Client, RequestFactory
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from chat.apikeys import apikey_create, apikey_revoke
from chat.feedback import completion_id
from chat.models import ChatSession, Message
from inference_ops.models import EngineProcess, LoraAdapter
from knowledge.models import Calibration, EmbeddingModel, Hit, Miss
from knowledge.services.entries import entry_create
from routing.models import GroupPriority
from spend.models import Limit
from tests.support.factories import endpoint, rule
from tests.support.personas import EVERY_VERB, NO_DELETE, VIEW_ONLY, staff_user
from tests.support.sockets import socket_at

pytestmark = pytest.mark.django_db(transaction=True)

# Staff, from least to most: is_staff and no permission at all; the view permission of what
# curators look after (tests.support.personas.CURATED); every permission there but delete; all of
# them.
STAFF = (
    "staff without permissions",
    "view-only staff",
    "curator without delete",
    "curator",
    "superuser",
)
SESSIONS = ("anonymous", "user", "other user", *STAFF)
KEYS = (
    "chat key",
    "chat key of curator",
    "kb key of curator",
    "kb key of view-only staff",
    "kb key of ex-staff",
    "key of inactive user",
    "revoked key",
)
CALLERS = SESSIONS + KEYS

SAME = "the same as anonymous"  # a status that depends on the machine, not on the caller


def row(
    anonymous,
    user,
    other,
    bare,
    viewer,
    no_delete,
    curator,
    superuser,
    chat_key,
    chat_curator,
    kb_curator,
    kb_viewer,
    kb_ex_staff,
    inactive,
    revoked,
):
    return dict(
        zip(
            CALLERS,
            (
                anonymous,
                user,
                other,
                bare,
                viewer,
                no_delete,
                curator,
                superuser,
                chat_key,
                chat_curator,
                kb_curator,
                kb_viewer,
                kb_ex_staff,
                inactive,
                revoked,
            ),
        )
    )


def page(anonymous, user, other, bare, viewer, no_delete, curator, superuser):
    """A page: keys are for APIs, so every key gets what anonymous gets (the login redirect)."""
    return row(
        anonymous,
        user,
        other,
        bare,
        viewer,
        no_delete,
        curator,
        superuser,
        *[anonymous] * len(KEYS),
    )


def admin_page(bare, viewer, no_delete, curator, superuser):
    """An admin page: whoever is not staff is sent to the admin's login."""
    return page(302, 302, 302, bare, viewer, no_delete, curator, superuser)


ENTRY = '{"question": "Can I return a gift?", "answer": "Yes, within 30 days."}'

# (method, path, JSON body) → the status each caller gets. None: not asked (it would change the data
# the other rows need). {U}, {S} and {K} are the user, their chat session and API key, {M} an
# answer in that session and {V} its /v1 completion id, {E} a KB entry, {X} an id no entry has, {C}
# a calibration run. Pages answer a key with the login redirect
# (keys are for APIs); APIs answer a missing or bad key with 401, a caller without the right with
# 403, another user's object with 404.
MATRIX = {
    #                                       anon user other | bare view nodel cur super
    ("GET", "/", None): page(302, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "/keys/", None): page(302, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "/accounts/login/", None): page(200, 302, 302, 302, 302, 302, 302, 302),
    ("GET", "/accounts/logout/", None): row(*[405] * 15),
    ("GET", "/healthz", None): row(*[200] * 15),
    # No METRICS_TOKEN and DEBUG off: nobody scrapes, whoever they are logged in as.
    ("GET", "/metrics", None): row(*[403] * 15),
    # 200 or 503 by whether a Celery worker runs (another test may have started one): the same for
    # all.
    ("GET", "/readyz", None): row(*[SAME] * 15),
    ("GET", "/admin/", None): admin_page(200, 200, 200, 200, 200),
    # The admin's sign-in page (its own URL: throttled failures answer 429); staff are sent on.
    ("GET", "/admin/login/", None): page(200, 200, 200, 302, 302, 302, 302, 302),
    #                                                      bare view nodel cur super
    # The request log needs its own view permission, which curators (of the KB, rules, engines
    # and keys) are not given.
    ("GET", "/admin/observability/requestlog/dashboard/", None): admin_page(
        403, 403, 403, 403, 200
    ),
    ("GET", "/admin/observability/requestlog/export.csv", None): admin_page(
        403, 403, 403, 403, 200
    ),
    ("GET", "/admin/knowledge/entry/", None): admin_page(403, 200, 200, 200, 200),
    # The KB's tools: trying a question reads entries; an import adds and edits them.
    ("GET", "/admin/knowledge/entry/try/?q=refund", None): admin_page(403, 200, 200, 200, 200),
    ("GET", "/admin/knowledge/entry/import/", None): admin_page(403, 403, 200, 200, 200),
    # The route tester shows every rule's conditions: the rules' view permission.
    ("GET", "/admin/routing/routingrule/tester/?text=refund", None): admin_page(
        403, 200, 200, 200, 200
    ),
    ("GET", "/admin/auth/user/", None): admin_page(403, 403, 403, 403, 200),
    ("GET", "/admin/routing/routingrule/add/", None): admin_page(403, 403, 200, 200, 200),
    # Rows that reach the host or send data to a URL: superusers edit, staff may look.
    ("GET", "/admin/knowledge/embeddingmodel/add/", None): admin_page(403, 403, 403, 403, 200),
    ("GET", "/admin/knowledge/embeddingmodel/", None): admin_page(403, 200, 200, 200, 200),
    ("GET", "/admin/inference_ops/engineprocess/add/", None): admin_page(403, 403, 403, 403, 200),
    ("GET", "/admin/inference_ops/modelendpoint/add/", None): admin_page(403, 403, 403, 403, 200),
    ("GET", "/admin/inference_ops/modelendpoint/", None): admin_page(403, 200, 200, 200, 200),
    ("GET", "/admin/auth/user/{U}/password/", None): admin_page(403, 403, 403, 403, 200),
    # A run with no operating point: the superuser's apply says so and sends back to the run. A form
    # posted without a session has no CSRF token: refused before anything else.
    ("POST", "/admin/knowledge/calibration/{C}/apply/", None): row(
        403, 302, 302, 403, 403, 403, 403, 302, 403, 403, 403, 403, 403, 403, 403
    ),
    # A run over the last days' traffic changes nothing that serves: whoever may add calibrations.
    ("POST", "/admin/knowledge/calibration/from-traffic/", None): row(
        403, 302, 302, 403, 403, 302, 302, 302, 403, 403, 403, 403, 403, 403, 403
    ),
    # anon user other bare view nodel cur super | chat chatC kbC kbV kbEx inact rev
    ("GET", "/api/kb/entries/", None): row(
        401, 403, 403, 403, 200, 200, 200, 200, 403, 403, 200, 200, 403, 401, 401
    ),
    ("POST", "/api/kb/entries/", ENTRY): row(
        401, 403, 403, 403, 403, 201, 201, 201, 403, 403, 201, 403, 403, 401, 401
    ),
    ("GET", "/api/kb/entries/{E}/", None): row(
        401, 403, 403, 403, 200, 200, 200, 200, 403, 403, 200, 200, 403, 401, 401
    ),
    ("PATCH", "/api/kb/entries/{E}/", '{"tags": ["refunds"]}'): row(
        401, 403, 403, 403, 403, 200, 200, 200, 403, 403, 200, 403, 403, 401, 401
    ),
    # An entry that does not exist: 404 says the caller got past the permission check, and the entry
    # the other rows read stays.
    ("DELETE", "/api/kb/entries/{X}/", None): row(
        401, 403, 403, 403, 403, 403, 404, 404, 403, 403, 404, 403, 403, 401, 401
    ),
    ("GET", "/api/kb/search?q=refund", None): row(
        401, 403, 403, 403, 200, 200, 200, 200, 403, 403, 200, 200, 403, 401, 401
    ),
    ("GET", "/api/kb/answer?q=refund", None): row(
        401, 403, 403, 403, 200, 200, 200, 200, 403, 403, 200, 200, 403, 401, 401
    ),
    ("POST", "/api/routing/explain", '{"text": "What is the refund policy?"}'): row(
        401, 403, 403, 403, 200, 200, 200, 200, 403, 403, 200, 200, 403, 401, 401
    ),
    ("GET", "/api/chat/sessions/", None): row(
        401, 200, 200, 200, 200, 200, 200, 200, 200, 200, 403, 403, 403, 401, 401
    ),
    ("GET", "/api/chat/sessions/{S}/", None): row(
        401, 200, 404, 404, 404, 404, 404, 404, 200, 404, 403, 403, 403, 401, 401
    ),
    ("GET", "/api/chat/sessions/{S}/messages/", None): row(
        401, 200, 404, 404, 404, 404, 404, 404, 200, 404, 403, 403, 403, 401, 401
    ),
    (
        "POST",
        "/api/chat/sessions/{S}/messages/stream",
        '{"content": "What is the refund policy?"}',
    ): row(401, 200, 404, 404, 404, 404, 404, 404, 200, 404, 403, 403, 403, 401, 401),
    # A verdict on one's own answer only.
    ("POST", "/api/chat/messages/{M}/feedback", '{"verdict": "up"}'): row(
        401, 200, 404, 404, 404, 404, 404, 404, 200, 404, 403, 403, 403, 401, 401
    ),
    # A new version of one's own last exchange only: the owner's request is refused for its body
    # (0 tokens; an edit names an answer), so that it changes nothing the other rows need.
    ("POST", "/api/chat/messages/{M}/regenerate", '{"max_tokens": 0}'): row(
        401, 400, 404, 404, 404, 404, 404, 404, 400, 404, 403, 403, 403, 401, 401
    ),
    ("POST", "/api/chat/messages/{M}/edit", '{"content": "Hello?"}'): row(
        401, 400, 404, 404, 404, 404, 404, 404, 400, 404, 403, 403, 403, 401, 401
    ),
    ("POST", "/api/chat/messages/{M}/regenerate/stream", '{"max_tokens": 0}'): row(
        401, 400, 404, 404, 404, 404, 404, 404, 400, 404, 403, 403, 403, 401, 401
    ),
    ("POST", "/api/chat/messages/{M}/edit/stream", '{"content": "Hello?"}'): row(
        401, 400, 404, 404, 404, 404, 404, 404, 400, 404, 403, 403, 403, 401, 401
    ),
    # One's own messages only (tests/chat/test_search.py: nothing of another user's is found).
    ("GET", "/api/chat/search?q=hello", None): row(
        401, 200, 200, 200, 200, 200, 200, 200, 200, 200, 403, 403, 403, 401, 401
    ),
    ("GET", "/api/keys/", None): row(
        401, 200, 200, 200, 200, 200, 200, 200, 403, 403, 403, 403, 403, 401, 401
    ),
    ("DELETE", "/api/keys/{K}/", None): row(
        401, None, 404, 404, 404, 404, 404, 404, 403, 403, 403, 403, 403, 401, 401
    ),
    # One's own limits and spend; a kb-only key is not a chat client.
    ("GET", "/api/usage", None): row(
        401, 200, 200, 200, 200, 200, 200, 200, 200, 200, 403, 403, 403, 401, 401
    ),
    ("GET", "/api/schema/", None): row(*[200] * 15),
    ("GET", "/api/docs/", None): row(*[200] * 15),
    ("GET", "/v1/models", None): row(
        401, 401, 401, 401, 401, 401, 401, 401, 200, 200, 403, 403, 403, 401, 401
    ),
    (
        "POST",
        "/v1/chat/completions",
        (
            '{"model": "auto", '
            '"messages": [{"role": "user", "content": "What is the refund policy?"}]}'
        ),
    ): row(401, 401, 401, 401, 401, 401, 401, 401, 200, 200, 403, 403, 403, 401, 401),
    ("POST", "/v1/completions", '{"model": "auto", "prompt": "The refund policy is"}'): row(
        401, 401, 401, 401, 401, 401, 401, 401, 200, 200, 403, 403, 403, 401, 401
    ),
    ("POST", "/v1/embeddings", '{"model": "auto", "input": "What is the refund policy?"}'): row(
        401, 401, 401, 401, 401, 401, 401, 401, 200, 200, 403, 403, 403, 401, 401
    ),
    # A verdict on a completion: the id is signed for its user, so another's key finds nothing.
    ("POST", "/v1/chat/completions/{V}", '{"metadata": {"feedback": "down"}}'): row(
        401, 401, 401, 401, 401, 401, 401, 401, 200, 404, 403, 403, 403, 401, 401
    ),
}

# The sockets: accepted, or closed with the code the page shows. Keys do not open sockets.
SOCKETS = {
    "/ws/chat/": dict(zip(SESSIONS, ("closed 4401", *["accepted"] * 7))),
    # The operations feed is for staff who may view the engines
    # (tests/observability/test_ops_socket.py: until their login or that permission ends).
    "/ws/ops/": dict(
        zip(
            SESSIONS,
            ("closed 4403", "closed 4403", "closed 4403", "closed 4403", *["accepted"] * 4),
        )
    ),
}

# Every registered model's admin pages, for each kind of staff (STAFF's order): what the admin
# lets them do there, read from the pages: "v" the list opens, "a" the add form opens, "c" a
# change is accepted, "d" the delete page opens. Whoever is not staff gets the admin's login
# (the MATRIX rows above).
ADMIN_PAGES = {
    "auth.group": ("", "", "", "", "vacd"),
    "auth.user": ("", "", "", "", "vacd"),
    # Conversations and the request log are not the curators'.
    "chat.chatsession": ("", "", "", "", "vacd"),
    "chat.message": ("", "", "", "", "vcd"),
    "observability.requestlog": ("", "", "", "", "v"),
    # Keys are immutable but for revocation (an action) and the client name staff give one (routing
    # rules match it), both the change permission's.
    "chat.apikey": ("", "v", "vc", "vcd", "vcd"),
    "knowledge.entry": ("", "v", "vac", "vacd", "vacd"),
    "knowledge.miss": ("", "v", "vc", "vcd", "vcd"),  # misses are written by requests only
    "knowledge.hit": ("", "v", "vc", "vcd", "vcd"),  # so are direct answers; curators judge them
    # Superusers edit what reaches the host or sends data out (core.admin.SuperuserEdits).
    "knowledge.embeddingmodel": ("", "v", "v", "v", "vacd"),
    "knowledge.calibration": ("", "v", "v", "v", "vd"),  # written by `manage.py kb_calibrate`
    "routing.routingrule": ("", "v", "vac", "vacd", "vacd"),
    # A group's priority class at a full endpoint, as a key's is: the curators' (routing).
    "routing.grouppriority": ("", "v", "vac", "vacd", "vacd"),
    "inference_ops.modelendpoint": ("", "v", "v", "v", "vacd"),
    # Spend limits decide what is paid for: not the curators'; granted apart (spend.*).
    "spend.limit": ("", "", "", "", "vacd"),
    "inference_ops.engineprocess": ("", "v", "v", "v", "vacd"),
    "inference_ops.loraadapter": ("", "v", "v", "v", "vacd"),
    # What leaves the building: superusers' (one row, never deleted; the add form only while none).
    "privacy.privacysettings": ("", "v", "v", "v", "vac"),
}

# Every admin action of every registered model, for each kind of staff (STAFF's order): whether it
# ran on a selected row when posted, as if the form offered it.
RAN, NO = "ran", "refused"
ACTIONS = {
    ("auth.group", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("auth.user", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("chat.chatsession", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("chat.message", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("chat.apikey", "delete_selected"): (NO, NO, NO, RAN, RAN),
    ("chat.apikey", "revoke"): (NO, NO, RAN, RAN, RAN),  # the model's change permission
    ("knowledge.entry", "delete_selected"): (NO, NO, NO, RAN, RAN),
    ("knowledge.entry", "activate"): (NO, NO, RAN, RAN, RAN),
    ("knowledge.entry", "deactivate"): (NO, NO, RAN, RAN, RAN),
    ("knowledge.entry", "reembed_selected"): (NO, NO, RAN, RAN, RAN),
    ("knowledge.entry", "reembed_everything"): (NO, NO, RAN, RAN, RAN),
    ("knowledge.miss", "delete_selected"): (NO, NO, NO, RAN, RAN),
    ("knowledge.miss", "add_as_phrasings"): (NO, NO, RAN, RAN, RAN),  # change entries and misses
    ("knowledge.miss", "add_to_entry"): (NO, NO, RAN, RAN, RAN),  # the same, to an entry picked
    ("knowledge.miss", "dismiss"): (NO, NO, RAN, RAN, RAN),  # change on misses
    ("knowledge.miss", "make_entry"): (
        NO,
        NO,
        RAN,
        RAN,
        RAN,
    ),  # knowledge.add_entry, and change on misses
    ("knowledge.hit", "delete_selected"): (NO, NO, NO, RAN, RAN),
    ("knowledge.hit", "mark_right"): (NO, NO, RAN, RAN, RAN),  # change on direct answers
    ("knowledge.hit", "mark_wrong"): (NO, NO, RAN, RAN, RAN),
    ("knowledge.embeddingmodel", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("knowledge.calibration", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("knowledge.calibration", "apply"): (NO, NO, NO, NO, RAN),
    ("routing.routingrule", "delete_selected"): (NO, NO, NO, RAN, RAN),
    ("routing.grouppriority", "delete_selected"): (NO, NO, NO, RAN, RAN),
    ("inference_ops.modelendpoint", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("spend.limit", "delete_selected"): (NO, NO, NO, NO, RAN),
    # Operating engines and adapters: the model's change permission; editing their rows: superusers.
    ("inference_ops.engineprocess", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("inference_ops.engineprocess", "start"): (NO, NO, RAN, RAN, RAN),
    ("inference_ops.engineprocess", "stop"): (NO, NO, RAN, RAN, RAN),
    ("inference_ops.engineprocess", "restart"): (NO, NO, RAN, RAN, RAN),
    ("inference_ops.loraadapter", "delete_selected"): (NO, NO, NO, NO, RAN),
    ("inference_ops.loraadapter", "load"): (NO, NO, RAN, RAN, RAN),
    ("inference_ops.loraadapter", "unload"): (NO, NO, RAN, RAN, RAN),
}


@pytest.fixture
def world(django_user_model, local_sim):
    users = {
        "user": django_user_model.objects.create_user("alice", password="pw-alice-123456"),
        "other user": django_user_model.objects.create_user("bob", password="pw-bob-123456"),
        "staff without permissions": staff_user("sam"),
        "view-only staff": staff_user("vera", verbs=VIEW_ONLY),
        "curator without delete": staff_user("nadia", verbs=NO_DELETE),
        "curator": staff_user("carol", verbs=EVERY_VERB),
        "superuser": django_user_model.objects.create_superuser("root", password="pw-root-123456"),
    }
    curator, viewer = users["curator"], users["view-only staff"]
    entry = entry_create(
        question="What is the refund policy?", answer="Refunds within 30 days.", embed="sync"
    )
    local = endpoint("local", local_sim)
    rule("default", local, is_default=True, use_kb_context=False)
    session = ChatSession.objects.create(user=users["user"], title="mine")
    chat_key, chat_raw = apikey_create(user=users["user"], name="laptop", scopes=["chat"])
    revoked, revoked_raw = apikey_create(user=users["user"], name="old", scopes=["chat"])
    apikey_revoke(key=revoked)
    demoted = django_user_model.objects.create_user(
        "dave", password="pw-dave-123456", is_staff=True
    )
    ex_staff_raw = apikey_create(user=demoted, name="curation", scopes=["kb"])[1]
    demoted.is_staff = False
    demoted.save()
    gone = django_user_model.objects.create_user("eve", password="pw-eve-123456")
    inactive_raw = apikey_create(user=gone, name="laptop", scopes=["chat"])[1]
    gone.is_active = False
    gone.save()
    keys = {
        "chat key": chat_raw,
        "chat key of curator": apikey_create(user=curator, name="laptop", scopes=["chat"])[1],
        "kb key of curator": apikey_create(user=curator, name="curation", scopes=["kb"])[1],
        "kb key of view-only staff": apikey_create(user=viewer, name="curation", scopes=["kb"])[1],
        "kb key of ex-staff": ex_staff_raw,
        "key of inactive user": inactive_raw,
        "revoked key": revoked_raw,
    }
    # A row of every other model the admin lists, for its actions to select.
    model = EmbeddingModel.objects.get()  # the one the entry was embedded with
    calibration = Calibration.objects.create(
        model=model, source="labels.jsonl", target=0.95, questions=10, answerable=8
    )
    engine = EngineProcess.objects.create(
        name="gpu-1", endpoint=local, model="acme/local", port=18001
    )
    LoraAdapter.objects.create(engine=engine, name="legal", path="/adapters/legal", static=False)
    Miss.objects.create(
        question="Do you sell gift cards?",
        normalized="do you sell gift cards?",
        answer="Yes, from 10 to 200 euros.",
        count=3,
        grouped_at=timezone.now(),
    )
    Message.objects.create(session=session, role="user", content="hello")
    answer = Message.objects.create(
        session=session, role="assistant", content="Hi.", request_key=uuid.uuid4()
    )
    Hit.objects.create(
        question="How do I get a refund?",
        normalized="how do i get a refund?",
        entry=entry,
        method="exact",
        created_at=timezone.now(),
        key=uuid.uuid4(),
    )
    Limit.objects.create(group=Group.objects.create(name="editors"), requests_per_minute=600)
    GroupPriority.objects.create(group=Group.objects.get(name="editors"), priority="batch")
    cookies = {}
    for name, user in users.items():
        client = Client()
        client.force_login(user)
        cookies[name] = client.cookies["sessionid"].value
    return {
        "users": users,
        "cookies": cookies,
        "keys": keys,
        "ids": {
            "S": session.pk,
            "K": chat_key.pk,
            "E": entry.pk,
            "X": entry.pk + 1000,
            "C": calibration.pk,
            "U": users["user"].pk,
            "M": answer.pk,
            # The user's answer as /v1 names it (a completion id is signed for its user).
            "V": completion_id(answer.request_key, users["user"].pk),
        },
    }


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
            credentials = (
                {"cookie": world["cookies"].get(caller)}
                if caller in SESSIONS
                else {"key": world["keys"][caller]}
            )
            got[(method, template, caller)] = _request(
                asgi_server, method, path, body, **credentials
            )
            expected[(method, template, caller)] = status
    for (method, template, caller), status in expected.items():
        if status == SAME:
            expected[(method, template, caller)] = got[(method, template, "anonymous")]
    wrong = {k: f"got {got[k]}, expected {expected[k]}" for k in expected if got[k] != expected[k]}
    assert wrong == {}, "\n".join(f"{k}: {v}" for k, v in sorted(wrong.items()))


async def _socket(path, session_key) -> str:
    socket = socket_at(path, session_key)
    connected, code = await socket.connect(timeout=10)
    await socket.disconnect()
    return "accepted" if connected else f"closed {code}"


def test_the_public_docs_ignore_a_bad_key_instead_of_failing(asgi_server, world):
    """A revoked key on the docs page, asking for JSON, was a 500 (the page's template asked for
    the user, which raised)."""
    revoked = {
        "Accept": "application/json",
        "Authorization": f"Bearer {world['keys']['revoked key']}",
    }
    assert _request(asgi_server, "GET", "/api/schema/", None, headers=revoked) == 200
    assert (
        _request(asgi_server, "GET", "/api/docs/", None, headers=revoked) == 406
    )  # an HTML page only


def test_every_socket_admits_only_its_callers(world):
    got = {
        (path, caller): async_to_sync(_socket)(path, world["cookies"].get(caller))
        for path, outcomes in SOCKETS.items()
        for caller in outcomes
    }
    expected = {
        (path, caller): outcome
        for path, outcomes in SOCKETS.items()
        for caller, outcome in outcomes.items()
    }
    assert {k: got[k] for k in expected if got[k] != expected[k]} == {}


def _paths(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if str(pattern.pattern) == "admin/":
                # The admin site's own pages: covered by its rows above and its own checks.
                yield "/admin/"
                yield from _admin_views()
                continue
            yield from _paths(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield "/" + prefix + str(pattern.pattern)


def _admin_views():
    """The views a ModelAdmin adds to the standard ones (list, add, change, delete, history: those
    are ADMIN_PAGES' business)."""
    for model, model_admin in admin.site._registry.items():
        standard = {str(p.pattern) for p in admin.ModelAdmin(model, admin.site).get_urls()}
        for pattern in model_admin.get_urls():
            if str(pattern.pattern) not in standard:
                yield f"/admin/{model._meta.app_label}/{model._meta.model_name}/{pattern.pattern}"


def _shape(path: str) -> str:
    """A path with its variable parts as "{}", whether a matrix placeholder or a URL converter."""
    return re.sub(r"\{[A-Z]\}|<[^>]+>", "{}", path.split("?")[0])


def test_every_url_is_in_the_matrix():
    placed = {_shape(template) for _, template, _ in MATRIX} | {"/"}
    routes = {_shape(path) for path in _paths(get_resolver().url_patterns)}
    assert routes - placed == set()


# --- the admin, in process: each kind of staff on every model's pages and actions -----------------


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _granted(response, *, yes: int) -> bool:
    assert response.status_code in (yes, 403), (
        f"{response.request['PATH_INFO']}: {response.status_code}"
    )
    return response.status_code == yes


def _admin_rights(client, label: str) -> str:
    base = f"/admin/{label.replace('.', '/')}/"
    # An id no row has: the admin checks the permission before it looks the row up, so the change
    # and delete pages answer 403 or send back to the index, and nothing is changed.
    missing = f"{base}2147483000/"
    rights = {
        "v": _granted(client.get(base), yes=200),
        "a": _granted(client.get(base + "add/"), yes=200),
        "c": _granted(client.post(missing + "change/", {}), yes=302),
        "d": _granted(client.get(missing + "delete/"), yes=302),
    }
    return "".join(letter for letter, granted in rights.items() if granted)


def test_every_kind_of_staff_gets_what_its_permissions_allow_on_every_admin_page(world):
    got, expected = {}, {}
    for caller_index, caller in enumerate(STAFF):
        client = _client(world["users"][caller])
        for label, rights in ADMIN_PAGES.items():
            got[(label, caller)], expected[(label, caller)] = (
                _admin_rights(client, label),
                rights[caller_index],
            )
    wrong = {
        k: f"got {got[k]!r}, expected {expected[k]!r}" for k in expected if got[k] != expected[k]
    }
    assert wrong == {}, "\n".join(f"{k}: {v}" for k, v in sorted(wrong.items()))


def _superuser_request(world):
    request = RequestFactory().get("/admin/")
    request.user = world["users"]["superuser"]
    return request


def _action_outcome(client, label: str, action: str, pk) -> str:
    """Whether the action ran, as the curator sees it: refused is the list again (or the list's
    403) with no word from the action; anything else (its message, its next page) means it ran."""
    url = f"/admin/{label.replace('.', '/')}/"
    response = client.post(url, {"action": action, "_selected_action": [pk]})
    if response.status_code == 403:
        return NO
    said = [str(m) for m in get_messages(response.wsgi_request) if str(m) != "No action selected."]
    rendered = [template.name for template in response.templates]
    listed_again = (response.status_code == 302 and response["Location"] == url) or (
        response.status_code == 200 and "admin/change_list.html" in rendered
    )
    return NO if listed_again and not said else RAN


def test_every_kind_of_staff_runs_only_the_admin_actions_its_permissions_allow(world):
    request = _superuser_request(world)
    rows = {
        model._meta.label_lower: model_admin.get_queryset(request).order_by("pk").first()
        for model, model_admin in admin.site._registry.items()
    }
    got, expected = {}, {}
    for caller_index, caller in enumerate(STAFF):
        for (label, action), outcomes in ACTIONS.items():
            assert rows[label] is not None, (
                f"{label}: the world has no row for its actions to select"
            )
            # A client of its own: an earlier action's message, still unread, would speak for this
            # one.
            client = _client(world["users"][caller])
            got[(label, action, caller)] = _action_outcome(client, label, action, rows[label].pk)
            expected[(label, action, caller)] = outcomes[caller_index]
    wrong = {k: f"got {got[k]}, expected {expected[k]}" for k in expected if got[k] != expected[k]}
    assert wrong == {}, "\n".join(f"{k}: {v}" for k, v in sorted(wrong.items()))


def test_every_admin_model_and_action_is_in_the_matrix(world):
    request = _superuser_request(world)  # a superuser is offered every action some staff may run
    registered = {model._meta.label_lower for model in admin.site._registry}
    actions = {
        (model._meta.label_lower, name)
        for model, model_admin in admin.site._registry.items()
        for name in model_admin.get_actions(request)
    }
    assert registered ^ set(ADMIN_PAGES) == set()
    assert actions ^ set(ACTIONS) == set()
