"""Staff as the admin sees them: a curator holds every permission over what curators look after;
the other personas hold less of it. Shared by the authorization matrix and each tool's tests."""

from functools import reduce
from operator import or_

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.db.models import Q
from django.test import Client

# What curators look after: the knowledge base, the routing rules, the engines, the privacy
# settings and the API keys (to revoke one). Not the request log, nor the users' conversations, nor
# the users.
CURATED = Q(content_type__app_label__in=["knowledge", "routing", "inference_ops", "privacy"]) | Q(
    content_type__app_label="chat", content_type__model="apikey"
)

EVERY_VERB = ("view", "add", "change", "delete")
NO_DELETE = ("view", "add", "change")
VIEW_ONLY = ("view",)


def staff_user(username: str, *, verbs: tuple[str, ...] = (), perms: tuple[str, ...] = ()):
    """A staff user holding `verbs` over what curators look after, plus `perms` ("app.codename")."""
    user = get_user_model().objects.create_user(
        username, password=f"pw-{username}-123456", is_staff=True
    )
    wanted = Q(pk__in=[])
    if verbs:
        wanted |= CURATED & reduce(or_, [Q(codename__startswith=f"{verb}_") for verb in verbs])
    for perm in perms:
        app_label, codename = perm.split(".")
        wanted |= Q(content_type__app_label=app_label, codename=codename)
    user.user_permissions.set(Permission.objects.filter(wanted))
    return user


def client_of(user) -> Client:
    """A test client logged in as `user`."""
    client = Client()
    client.force_login(user)
    return client


def shown_messages(response) -> list[str]:
    """The admin's messages the response carries, as the page shows them."""
    return [str(message) for message in get_messages(response.wsgi_request)]
