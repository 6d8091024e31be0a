"""Calling an endpoint: what a call needs of its row (`EndpointConfig`), its pooled SDK client per
event loop, and what every streamed call shares (`client.stream_chat`,
`other_apis.stream_completion`): the stream opened within its deadline on one of the endpoint's
slots, read a network read at a time, closed to free the engine, and each failure as one
`EngineError`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx2
import openai

from core.loops import PerLoop
from inference_ops.exceptions import EngineError
from inference_ops.sdk_errors import SDK_ERRORS, engine_error_from_sdk


@dataclass(frozen=True)
class EndpointConfig:
    """What a call needs from a ModelEndpoint row: immutable, hashable, safe across threads."""

    name: str
    base_url: str
    model: str
    # Out of the repr: a local endpoint's key is the one its engines require (engine_keys).
    api_key: str = field(default="", repr=False)
    connect_timeout: float = 3.0
    first_token_timeout: float = 30.0
    idle_timeout: float = 15.0
    total_timeout: float = 300.0
    max_concurrency: int = 64
    capacity: int | None = None  # all processes together (inference_ops.admission); None: no limit
    # An engine of the endpoint runs vLLM's priority scheduling: requests carry their class.
    priority_scheduling: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    # Retries before the first token, the pipeline's (routing.chain): how many, and the
    # backoff's base and cap in seconds.
    retries: int = 2
    retry_base: float = 0.25
    retry_cap: float = 2.0

    @classmethod
    def from_endpoint(cls, endpoint) -> EndpointConfig:
        return cls(
            name=endpoint.name,
            base_url=endpoint.base_url,
            model=endpoint.request_model,
            api_key=endpoint.api_key,
            connect_timeout=endpoint.connect_timeout,
            first_token_timeout=endpoint.first_token_timeout,
            idle_timeout=endpoint.idle_timeout,
            total_timeout=endpoint.total_timeout,
            max_concurrency=endpoint.max_concurrency,
            capacity=endpoint.capacity,
            headers=tuple(
                sorted((str(k), str(v)) for k, v in (endpoint.extra_headers or {}).items())
            ),
            retries=endpoint.retries,
            retry_base=endpoint.retry_base,
            retry_cap=endpoint.retry_cap,
        )


class _Pool:
    def __init__(self, config: EndpointConfig):
        # No read timeout for the transport: stream_chat bounds the response headers and every
        # read itself (one timer per stream). Given one, aiohttp re-arms a timer on each chunk it
        # receives, a timer heap operation per token and stream.
        timeout = httpx2.Timeout(
            connect=config.connect_timeout, read=None, write=10.0, pool=config.first_token_timeout
        )
        # The SDK's aiohttp transport: a streamed request costs the gateway less than half the
        # CPU of the default httpx one (docs/benchmarks.md#fig-aiohttp-transport), paid per request.
        # Connections: as many as the endpoint may have in flight, all kept alive between requests.
        limits = httpx2.Limits(
            max_connections=config.max_concurrency, max_keepalive_connections=config.max_concurrency
        )
        # Retries belong to the pipeline (it may pick another target), not to the SDK.
        self.client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key or "EMPTY",
            timeout=timeout,
            max_retries=0,
            default_headers=dict(config.headers) or None,
            http_client=openai.DefaultAioHttpClient(timeout=timeout, limits=limits),
        )
        self.slots = asyncio.Semaphore(config.max_concurrency)


# HTTP connections belong to the event loop that opened them: one pool per (endpoint, loop).
_pools: PerLoop[_Pool] = PerLoop()


def pool_for(config: EndpointConfig) -> _Pool:
    return _pools.get(lambda: _Pool(config), config)


async def open_stream(
    pool: _Pool,
    config: EndpointConfig,
    path: str,
    body: dict,
    *,
    until: float,
    extra_headers: dict[str, str] | None = None,
) -> httpx2.Response:
    """Take one of the endpoint's slots and send a streamed request, both by `until` (the loop's
    clock): the response, its slot held until `close_stream`; or EngineError, the slot given
    back."""
    acquired = False
    try:
        try:
            async with asyncio.timeout_at(until):
                await pool.slots.acquire()
                acquired = True
                return await pool.client.post(
                    path,
                    cast_to=httpx2.Response,
                    body=body,
                    stream=True,
                    stream_cls=None,
                    options={"headers": extra_headers} if extra_headers else {},
                )
        except TimeoutError:
            what = (
                "no response headers in time"
                if acquired
                else f"all {config.max_concurrency} slots stayed busy"
            )
            raise EngineError("timeout_first_token", what, endpoint=config.name) from None
        except SDK_ERRORS as exc:
            raise engine_error_from_sdk(
                exc, produced=False, during_request=True, endpoint=config.name
            ) from exc
    except BaseException:
        if acquired:
            pool.slots.release()
        raise


def stream_reads(response: httpx2.Response):
    """The response's bytes a network read at a time: raw unless the engine compressed the
    stream (one generator layer less per read)."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    return response.aiter_bytes() if encoding not in ("", "identity") else response.aiter_raw()


async def close_stream(pool: _Pool, response: httpx2.Response) -> None:
    """Closing the response tells the engine the client is gone (vLLM aborts the request); its
    slot goes back."""
    try:
        await response.aclose()
    finally:
        pool.slots.release()


def read_timed_out(config: EndpointConfig, *, produced: bool, past_total: bool) -> EngineError:
    if past_total:
        kind, what = "timeout_total", f"the request took longer than {config.total_timeout:g}s"
    elif produced:
        kind, what = "timeout_idle", f"no token for {config.idle_timeout:g}s"
    else:
        kind, what = "timeout_first_token", f"no first token in {config.first_token_timeout:g}s"
    return EngineError(kind, what, produced_tokens=produced, endpoint=config.name)


def read_broke(config: EndpointConfig, exc: Exception, *, produced: bool) -> EngineError:
    return EngineError(
        "stream_truncated",
        f"the connection broke: {exc}",
        produced_tokens=produced,
        endpoint=config.name,
    )


def error_event(config: EndpointConfig, error, *, produced: bool) -> EngineError:
    """An error event inside the stream (vLLM's, after its 200)."""
    message = error.get("message") if isinstance(error, dict) else error
    return EngineError(
        "stream_error",
        f"error in the stream: {message}",
        produced_tokens=produced,
        endpoint=config.name,
    )


def unreadable_chunk(config: EndpointConfig, exc: Exception, *, produced: bool) -> EngineError:
    return EngineError(
        "malformed", f"unreadable chunk: {exc}", produced_tokens=produced, endpoint=config.name
    )


def unfinished(config: EndpointConfig, *, produced: bool) -> EngineError:
    return EngineError(
        "stream_truncated",
        "the stream ended without a finish reason",
        produced_tokens=produced,
        endpoint=config.name,
    )
