"""Fault injection: the fault a request gets (named by its X-Sim-Fail header, or drawn at
--failure-injection-rate), the faults that strike before a request is handled, and a dropped
connection. Where the other faults strike is up to each route."""

import asyncio
import logging

from aiohttp import web

from .config import FAULTS
from .http_json import json_response
from .protocol import ENGINE_ERROR_MESSAGE, APIError, error_body
from .state import SIM

logger = logging.getLogger("inference_ops.simulator")

FAULT_HEADER = "X-Sim-Fail"
HANG_SECONDS = 3600.0  # a hung request is released by the client giving up, or after this


def pick_fault(request: web.Request) -> str | None:
    sim = request.app[SIM]
    header = request.headers.get(FAULT_HEADER)
    if header:
        fault = header.strip().lower()
        if fault not in FAULTS:
            raise APIError(
                f"Unknown {FAULT_HEADER} value {header!r}; expected one of: {', '.join(FAULTS)}."
            )
    elif (
        sim.config.failure_injection_rate
        and sim.fault_rng.random() < sim.config.failure_injection_rate
    ):
        fault = sim.fault_rng.choice(FAULTS)
    else:
        return None
    logger.info("injecting fault %s into %s %s", fault, request.method, request.path)
    return fault


async def early_fault(request: web.Request, fault: str | None) -> web.Response | None:
    """The faults that strike before the request is handled: the connection dropped, a hang, a
    500 (raised), or a 429 (returned, for the handler to send)."""
    if fault == "connect-close":
        await drop_connection(request)
    if fault == "hang":
        await asyncio.sleep(HANG_SECONDS)
        await drop_connection(request)
    if fault == "500":
        raise APIError(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
    if fault == "429":
        body = error_body(
            "The server is overloaded, retry later.", err_type="RateLimitError", status=429
        )
        return json_response(body, status=429, headers={"Retry-After": "1"})
    return None


async def drop_connection(request: web.Request):
    """Close the TCP connection with no (further) HTTP response."""
    transport = request.transport
    if transport is not None:
        transport.close()
    # aiohttp cancels this handler once it notices the connection is gone
    # (handler_cancellation=True); nothing is ever written.
    await asyncio.sleep(HANG_SECONDS)
    raise ConnectionResetError("connection dropped by fault injection")
