"""Django's ASGI handler, with less thread switching per request."""

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler

from core.db import release_connections
from core.threads import own_thread


class SyncStackASGIHandler(ASGIHandler):
    """Django's ASGI handler with two changes, both about thread switches on every request.

    1. The middleware stack runs as sync code, entered once. Django's own handler builds it in
       async mode, and each of Django's middleware (all of them MiddlewareMixin) then hops to the
       request's thread and back for process_request and again for process_response; with
       WhiteNoise (sync only) in the stack, the chain also hops back to the event loop below
       it: about a dozen switches a request (what that cost: docs/benchmarks.md#fig-sync-stack).
    2. Each request's thread comes from a pool instead of being started for the request and
       joined after it (core.threads.own_thread).

    Nothing else changes. A request still has one thread of its own for its sync work (a
    thread serves one request at a time), sync views run in it, and async views (the streaming
    DRF chat API; /v1 is an ASGI app of its own, chat.openai_api) still run on the event loop:
    Django wraps them in async_to_sync, which hands the coroutine to the loop while the
    request's thread waits for its response. A streaming body is sent from the loop.
    """

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        async with own_thread():
            await self.handle(scope, receive, send)

    async def get_response_async(self, request):
        return await sync_to_async(self._respond, thread_sensitive=True)(request)

    def _respond(self, request):
        response = self.get_response(request)
        if response.streaming:
            # A streamed answer lasts as long as its tokens, and Django would keep this thread's
            # database connection until the end: give it back now, the body needs none.
            release_connections()
        return response


def get_asgi_application() -> SyncStackASGIHandler:
    """django.core.asgi.get_asgi_application, with the handler above."""
    import django

    django.setup(set_prefix=False)
    return SyncStackASGIHandler()
