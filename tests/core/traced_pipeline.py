"""The answer pipeline in a process of its own, for tests/core/test_tracing.py.

Tracing is decided from the environment once per process, so each case runs here, started with
the environment it tests. argv[1] is a JSON list of questions (RouteRequest fields, plus
`stop_after`: close the stream after that many events, as a client that goes away). Prints one
JSON line per question with its events, then one line saying what of OpenTelemetry was loaded.
The spans leave when the process exits (the SDK flushes its batch at exit).
"""

import asyncio
import contextlib
import dataclasses
import json
import sys

import django


async def _ask(pipeline, request_type, question: dict) -> list[dict]:
    stop_after = question.pop("stop_after", None)
    events = []
    async with contextlib.aclosing(pipeline.answer(request_type(**question))) as stream:
        async for event in stream:
            events.append(dataclasses.asdict(event))  # every field, the operators' too
            if stop_after is not None and len(events) >= stop_after:
                break
    return events


async def _main(questions: list[dict]) -> None:
    from core import db
    from routing import pipeline
    from routing.events import RouteRequest

    with db.unbound():  # as the /v1 API and the socket run a turn
        for question in questions:
            print(json.dumps(await _ask(pipeline, RouteRequest, question), default=str), flush=True)
    print(
        json.dumps(
            {
                "modules": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
                "wrapped": hasattr(pipeline.answer, "__wrapped__"),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    django.setup()
    asyncio.run(_main(json.loads(sys.argv[1])))
