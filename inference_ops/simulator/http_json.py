"""What every route shares on the HTTP side: a JSON body read as vLLM's FastAPI reads it, a
compact JSON response, and errors (ours and aiohttp's) answered with the bodies vLLM's clients
see."""

import asyncio
import json
import logging

from aiohttp import web

from .protocol import APIError, dumps, validation_error

access_logger = logging.getLogger("aiohttp.access")


@web.middleware
async def errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as exc:
        return json_response(exc.body(), status=exc.status)
    except web.HTTPNotFound:
        # FastAPI's body for an unknown route, which is what clients of vLLM see.
        return json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return json_response({"detail": "Method Not Allowed"}, status=405)
    except asyncio.CancelledError:
        # aiohttp writes no access line for a handler cut short; say what happened.
        access_logger.info(
            '%s "%s %s" connection closed before the response ended',
            request.remote,
            request.method,
            request.path,
        )
        raise


def json_response(body, *, status: int = 200, headers=None) -> web.Response:
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


def json_body(request: web.Request, raw: bytes):
    # vLLM's validate_json_request: anything but application/json is a 400.
    if request.content_type != "application/json":
        raise APIError("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        # FastAPI names the position where decoding failed, and the decoder's complaint.
        raise validation_error(
            str(exc.pos), "JSON decode error", "json_invalid", ctx={"error": exc.msg}
        ) from None
    except ValueError:
        raise validation_error("body", "JSON decode error", "json_invalid") from None
