"""Graceful drain of a web process: on SIGTERM (or SIGINT) it finishes what it has, then exits.

Left to itself, daphne stops Twisted's reactor on the signal and cancels every request at once: a
stream in flight ends mid-answer with no last event, and its turn is stored as cancelled. Here
the signal starts a drain instead:

1. /readyz answers 503 at once, failing `draining` (config.health), so a load balancer takes the
   process out, and new chat turns are refused with a retryable 503 or error frame
   (chat.exceptions.Draining); the turns running and the HTTP requests in flight go on;
2. once nothing is in flight, or after WEB_DRAIN_SECONDS, the turns still running are ended
   (chat.turns.turns_end_running): each one's last event says `shutdown`, and it is stored as
   partial (failed before its first token), in the request log too;
3. the reactor stops, and daphne exits.

A second signal skips to step 2. The supervisor's grace before SIGKILL must be longer than the
drain; config.web reads WEB_DRAIN_SECONDS for its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from core.env import env_float

logger = logging.getLogger(__name__)

# chat.turns and Django's settings are imported where they are used: the settings module imports
# this one (drain_seconds), before any app is loaded.

# After turns_end_running, how long the ended turns have to send their last event and store
# themselves: a database write and a few bytes, but on a loaded machine (the suite beside other
# work) the database thread can wait seconds for a core. Within config.web's STOP_GRACE, which
# follows it.
ENDING_GRACE = 5.0

draining = False
_requests: set[asyncio.Task] = set()  # the HTTP requests in flight
_cut: asyncio.Future | None = None  # set by a second signal
_drain_task: asyncio.Task | None = None  # held: the loop keeps only a weak reference to a task


def drain_seconds() -> float:
    """WEB_DRAIN_SECONDS, for the settings and for config.web, which loads no Django settings."""
    return env_float("WEB_DRAIN_SECONDS", 30.0, minimum=0.0)


def request_arrived() -> None:
    """Count the current task's HTTP request as in flight until its task ends, so that a request
    which is not a chat turn (a page, the DRF API's answer after its turn) also gets to finish.
    config.asgi calls it for each request. A done callback, not a wrapper around the application:
    a wrapper's frame would be resumed on every token of every stream."""
    task = asyncio.current_task()
    _requests.add(task)  # type: ignore[arg-type]  # called inside a task
    task.add_done_callback(_requests.discard)  # type: ignore[union-attr]  # called inside a task


def install() -> None:
    """Drain on SIGTERM and SIGINT when daphne serves from this process. Twisted installs its own
    handlers as its reactor starts, after the application is imported: these replace them just
    after, where Twisted put them. Where no reactor runs (the tests', a Celery worker) nothing
    changes, and without daphne's reactor installed (another server) nothing is imported: that
    import would install Twisted's default reactor."""
    if "daphne.server" not in sys.modules:
        return
    from twisted.internet import reactor

    reactor.addSystemEventTrigger("after", "startup", _take_signals, reactor)  # type: ignore[arg-type]  # Twisted's interfaces omit self


def _take_signals(reactor) -> None:
    # Only where Twisted has a handler: none without signal handlers (daphne's runserver with its
    # reloader runs the reactor off the main thread), none for a SIGINT someone else handles.
    for signum, twisted_handler in (
        (signal.SIGTERM, reactor.sigTerm),
        (signal.SIGINT, reactor.sigInt),
    ):
        if signal.getsignal(signum) == twisted_handler:
            signal.signal(
                signum, lambda number, frame: reactor.callFromThread(_on_signal, reactor, number)
            )


def _on_signal(reactor, signum: int) -> None:
    global draining, _cut, _drain_task
    from chat import turns

    name = signal.Signals(signum).name
    if draining:
        if not _cut.done():  # type: ignore[union-attr]  # _cut is set while draining
            logger.warning(
                "pid %d: %s during the drain: ending the turns still running now", os.getpid(), name
            )
            _cut.set_result(None)  # type: ignore[union-attr]  # _cut is set while draining
        return
    draining = True
    turns.turns_refuse_new()
    _cut = asyncio.get_running_loop().create_future()
    _drain_task = asyncio.ensure_future(_drain(reactor, name))


async def _drain(reactor, name: str) -> None:
    from django.conf import settings

    from chat import turns

    loop = asyncio.get_running_loop()
    started = loop.time()
    seconds = settings.WEB_DRAIN_SECONDS
    try:
        logger.info(
            "pid %d: %s: draining, %d turn(s) running and %d HTTP request(s) in flight, up to %g s",
            os.getpid(),
            name,
            len(turns.turns_running()),
            sum(not task.done() for task in _requests),
            seconds,
        )
        if not await _settled(until=started + seconds, cut=_cut):
            ended = turns.turns_end_running()
            logger.warning(
                "pid %d: %d turn(s) still running after %.1f s: ended as shutdown",
                os.getpid(),
                len(ended),
                loop.time() - started,
            )
            if not await _settled(until=loop.time() + ENDING_GRACE, cut=None):
                # Their clients get no last event: the stop below closes their connections.
                logger.warning(
                    "pid %d: %d request(s) still running %g s after the end; stopping anyway",
                    os.getpid(),
                    len(_busy()),
                    ENDING_GRACE,
                )
        logger.info("pid %d: drained in %.1f s; stopping", os.getpid(), loop.time() - started)
    except Exception:
        logger.exception("pid %d: the drain failed; stopping", os.getpid())
    finally:
        reactor.stop()


def _busy() -> set[asyncio.Task]:
    from chat import turns

    return {task for task in (*_requests, *turns.turns_running()) if not task.done()}


async def _settled(*, until: float, cut: asyncio.Future | None) -> bool:
    """True once nothing is in flight; False at `until` (the loop's clock) or on `cut`. A request
    that arrives meanwhile (a probe, a refused chat) is waited for too: it is short."""
    loop = asyncio.get_running_loop()
    while busy := _busy():
        remaining = until - loop.time()
        if remaining <= 0 or (cut is not None and cut.done()):
            return False
        await asyncio.wait(
            busy | ({cut} if cut is not None else set()),
            timeout=remaining,
            return_when=asyncio.FIRST_COMPLETED,
        )
    return True
