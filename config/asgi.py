"""HTTP goes to Django; WebSockets to the Channels router, authenticated by the session cookie.

Importing this module also warms the process (config.warmup): daphne imports the application
before it listens, so a process takes no connection before it has loaded what a request needs.
"""

import os

from config.bootstrap import process_setup
from config.handlers import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
process_setup()

# Django must be set up before anything imports models (consumers, auth middleware).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.core.cache import caches  # noqa: E402

from chat import openai_api  # noqa: E402
from config import body_limit, drain, twisted_tuning, warmup  # noqa: E402
from config.routing import websocket_urlpatterns  # noqa: E402
from core import tracing  # noqa: E402


async def http(scope, receive, send):
    drain.request_arrived()
    # The OpenAI-compatible API is an ASGI application of its own (see chat.openai_api).
    if scope["path"].startswith("/v1/"):
        return await openai_api.application(scope, receive, send)
    return await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))  # type: ignore[arg-type]  # Channels' path() entries
        ),
    }
)

# Django keeps cache objects in a context-local, and every request's context is a copy of this
# one: made here, one cache object and its Redis connection pool serve every request. Made first
# inside a request, it would be that request's alone, and each use (the rule snapshot's version
# check, the health check) would open a new Redis connection.
caches["default"]  # creating it is the point; it connects on first use

twisted_tuning.tune()
body_limit.install()
tracing.setup()
drain.install()
warmup.run()
