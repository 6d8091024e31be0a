"""Django's ASGI handler, with the middleware stack run once per request in a worker thread."""

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class SyncStackASGIHandler(ASGIHandler):
    """Runs the middleware stack as sync code, entered once per request.

    Django's ASGI handler builds the stack in async mode, and each of Django's own middleware
    (all of them MiddlewareMixin) then hops to the request's worker thread and back for its
    process_request and again for process_response; with WhiteNoise (sync only) in the
    stack, the chain also hops back to the event loop below it. About a dozen thread
    switches a request: measured, an exact KB answer over HTTP took 12.2 ms that way and
    7.3 ms this way on the 2-core development machine (`manage.py bench_kb`).

    Nothing else changes: each request still has its own thread (ThreadSensitiveContext),
    sync views run in it as before, and async views (the streaming chat and /v1 APIs) still
    run on the event loop: Django wraps them in async_to_sync, which hands the coroutine to
    the loop while the request's thread waits for it to return its response. A streaming
    body is sent from the loop, after the thread is done.
    """

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def get_asgi_application() -> SyncStackASGIHandler:
    """django.core.asgi.get_asgi_application, with the handler above."""
    import django

    django.setup(set_prefix=False)
    return SyncStackASGIHandler()
