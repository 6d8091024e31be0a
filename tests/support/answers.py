"""The answer pipeline run from a sync test, and what its events say."""

from asgiref.sync import async_to_sync

from routing import pipeline
from routing.events import RouteRequest


async def _collect(request, rng=None):
    return [event async for event in pipeline.answer(request, rng=rng)]


def ask(text, **fields):
    """Run the pipeline from a sync test: its ORM calls share the test's transaction."""
    return ask_request(RouteRequest(text=text, **fields))


def ask_request(request):
    """`ask` with a request made by the test, to read what the pipeline wrote on it after."""
    return async_to_sync(_collect)(request)


def kinds(events):
    return [e.type for e in events]


def answer_text(events):
    return "".join(e.text for e in events if e.type == "token")
