"""Fault injection: the fault grammar, which fault a request gets, and the faults that strike
before a request is handled. Where the faults of a stream strike is up to each route.

A fault is named per request by the `X-Sim-Fail` header, or per model name by `--fault
MODEL=SPEC` (a request whose `model` is MODEL gets SPEC), or drawn at --failure-injection-rate.
SPEC is `<fault>[;key=value]...`; every fault takes `times=N`: it strikes the first N requests
that carry the same SPEC (counted per process, and for --fault per model), then requests succeed
(default: always).

- `500`, `503[;retry-after=S]`: the status with vLLM's error body; `429[;retry-after=S|none]`
  (`Retry-After: 1` unless told otherwise; `none` sends no header).
- `connect-close`: the connection reset before any header; `hang`: accepted, never answered.
- `before-first-token`: a stream's 200 and headers, then the connection dropped.
- `slow-first-token;delay=S`: the first token S seconds late, then the normal pace.
- `mid-stream[;after=N][;how=error|close]`: the stream breaks after N content tokens: the
  connection dropped (`how=close`), or vLLM's in-stream error event then `[DONE]` (`how=error`:
  an engine failure as vLLM reports it). Without `after`, as it always was: after a few tokens,
  always before the end, with the error event; with `after`, the connection is dropped unless
  `how=error`.
- `stall[;after=N]`: no token after the Nth; the connection is left open.
- `malformed[;after=N]`: one unreadable `data:` line after N tokens; the stream then goes on
  whole.
- `no-done[;after=N]`: the response ends normally after N tokens, with no finish_reason, no
  usage and no `[DONE]`.
- `context-length[;max-model-len=N]`: the model's window is N tokens (default 16) for this
  request: one over it gets vLLM's 400, one within it is answered.
- `content-filter[;reason=WORDS]`: a 400 as OpenAI refuses on its content policy (code
  `content_filter`, the reason in the message).
- `no-prefill`: a request with `continue_final_message: true` is refused with the 400 vLLM gives
  when the chat template cannot continue the final message; other requests are answered.
- `flap;down=S;up=S`: from the first request that carries it, S seconds of 500s, then S seconds
  healthy, and again.
"""

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from aiohttp import web

from .errors import ENGINE_ERROR_MESSAGE, APIError, error_body
from .http_json import json_response

logger = logging.getLogger("inference_ops.simulator")

# The faults --failure-injection-rate draws from: those that need no key.
RANDOM_FAULTS = ("connect-close", "before-first-token", "mid-stream", "500", "429", "hang")
FAULTS = (
    *RANDOM_FAULTS,
    "503",
    "slow-first-token",
    "stall",
    "malformed",
    "no-done",
    "context-length",
    "content-filter",
    "no-prefill",
    "flap",
)
FAULT_HEADER = "X-Sim-Fail"
HANG_SECONDS = 3600.0  # a hung request is released by the client giving up, or after this
DEFAULT_CONTEXT = 16  # context-length's window: under any chat prompt plus a few tokens of answer
DEFAULT_REASON = "violence"

# The keys each fault takes besides `times`.
_KEYS = {
    "503": {"retry-after"},
    "429": {"retry-after"},
    "slow-first-token": {"delay"},
    "mid-stream": {"after", "how"},
    "stall": {"after"},
    "malformed": {"after"},
    "no-done": {"after"},
    "context-length": {"max-model-len"},
    "content-filter": {"reason"},
    "flap": {"down", "up"},
}
# Faults that strike during generation, where the route decides what they do.
STREAM_FAULTS = {"before-first-token", "slow-first-token", "mid-stream", "stall", "malformed"}
STREAM_FAULTS |= {"no-done"}

# What vLLM answers when the chat template loses the final message it was asked to continue
# (transformers' apply_chat_template, raised as a ValueError and answered as a 400).
NO_PREFILL_MESSAGE = (
    "continue_final_message is set but the final message does not appear in the chat after "
    "applying the chat template! This can happen if the chat template deletes portions of the "
    "final message. Please verify the chat template and final message in your chat to ensure "
    "they are compatible."
)


@dataclass(frozen=True)
class Fault:
    kind: str
    spec: str  # the text it was parsed from: what `times` counts by
    times: int | None = None  # None: every request
    after: int | None = None  # stream faults: content tokens before it strikes
    how: str = "error"  # mid-stream: "error" (an error event) or "close" (the connection)
    delay: float = 0.0  # slow-first-token
    retry_after: str | None = "1"  # 429 and 503: the header's value, None for no header
    max_model_len: int = DEFAULT_CONTEXT  # context-length
    reason: str = DEFAULT_REASON  # content-filter
    down: float = 5.0  # flap
    up: float = 5.0

    @property
    def counted(self) -> bool:
        return self.times is not None


def parse_spec(text: str) -> Fault:
    """A SPEC as the header or --fault gives it; ValueError says what is wrong with it."""
    kind, *pairs = [part.strip() for part in text.strip().split(";")]
    kind = kind.lower()
    if kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r}; expected one of: {', '.join(FAULTS)}")
    values: dict = {}
    for pair in pairs:
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not value:
            raise ValueError(f"{pair!r} in {text!r} is not key=value")
        if key != "times" and key not in _KEYS.get(kind, ()):
            allowed = ", ".join(sorted({"times"} | _KEYS.get(kind, set())))
            raise ValueError(f"fault {kind!r} takes no {key!r} (it takes: {allowed})")
        values[key] = value
    fault: dict = {"kind": kind, "spec": text.strip()}
    if "times" in values:
        fault["times"] = _number(values, "times", int, minimum=1)
    if "after" in values:
        fault["after"] = _number(values, "after", int, minimum=0)
    if "how" in values:
        if values["how"] not in ("error", "close"):
            raise ValueError(f"how={values['how']!r}: expected error or close")
        fault["how"] = values["how"]
    elif kind == "mid-stream" and "after" in values:
        fault["how"] = "close"  # the grammar agreed for the gateway's tests: after=N cuts
    if "delay" in values:
        fault["delay"] = _number(values, "delay", float, minimum=0)
    elif kind == "slow-first-token":
        fault["delay"] = 2.0
    if "retry-after" in values:
        raw = values["retry-after"]
        fault["retry_after"] = (
            None if raw.lower() == "none" else str(_number(values, "retry-after", int, minimum=0))
        )
    elif kind == "503":
        fault["retry_after"] = None  # vLLM's 503 says nothing of when to come back
    if "max-model-len" in values:
        fault["max_model_len"] = _number(values, "max-model-len", int, minimum=1)
    if "reason" in values:
        fault["reason"] = values["reason"]
    for key in ("down", "up"):
        if key in values:
            fault[key] = _number(values, key, float, minimum=0.1)
    return Fault(**fault)


def _number(values: dict, key: str, kind, *, minimum):
    try:
        number = kind(values[key])
    except ValueError:
        raise ValueError(f"{key}={values[key]!r} is not a number") from None
    if number < minimum:
        raise ValueError(f"{key} must be at least {minimum}, got {number}")
    return number


class FaultBook:
    """What the simulator remembers of its faults: how often each SPEC has struck (for `times`)
    and when each flapping SPEC was first asked for."""

    def __init__(self):
        self._struck: dict[str, int] = {}
        self._flap_start: dict[str, float] = {}

    def take(self, fault: Fault) -> bool:
        """Whether the fault strikes this request, counting it if so."""
        if not fault.counted:
            return True
        struck = self._struck.get(fault.spec, 0)
        if struck >= fault.times:  # type: ignore[operator]  # a counted fault has its times
            return False
        self._struck[fault.spec] = struck + 1
        return True

    def flap_down(self, fault: Fault) -> bool:
        start = self._flap_start.setdefault(fault.spec, time.monotonic())
        return (time.monotonic() - start) % (fault.down + fault.up) < fault.down


def pick_fault(request: web.Request, sim, raw: bytes = b"") -> Fault | None:
    """The fault this request carries: its header's, else its model's (--fault), else one drawn
    at --failure-injection-rate. `sim` is the Simulator (state.py)."""
    header = request.headers.get(FAULT_HEADER)
    if header:
        try:
            fault = parse_spec(header)
        except ValueError as exc:
            raise APIError(f"Bad {FAULT_HEADER} value {header!r}: {exc}.") from None
    elif sim.model_faults and (model := _peek_model(raw)) in sim.model_faults:
        fault = sim.model_faults[model]
    elif (
        sim.config.failure_injection_rate
        and sim.fault_rng.random() < sim.config.failure_injection_rate
    ):
        fault = Fault(kind=(kind := sim.fault_rng.choice(RANDOM_FAULTS)), spec=kind)
    else:
        return None
    logger.info("injecting fault %s into %s %s", fault.spec, request.method, request.path)
    return fault


def _peek_model(raw: bytes) -> str | None:
    # Before the body is validated (a fault may strike a request vLLM would refuse), so leniently.
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


async def early_fault(request: web.Request, sim, fault: Fault | None) -> web.Response | None:
    """The faults that strike before the request is handled: the connection dropped, a hang, an
    error status (raised or returned for the handler to send), a flap's down time."""
    if fault is None:
        return None
    kind = fault.kind
    if kind == "flap":
        if not sim.faults.flap_down(fault) or not sim.faults.take(fault):
            return None
        kind = "500"
    elif kind not in ("connect-close", "hang", "500", "503", "429", "content-filter"):
        return None
    elif not sim.faults.take(fault):
        return None
    if kind == "connect-close":
        await drop_connection(request)
    if kind == "hang":
        await asyncio.sleep(HANG_SECONDS)
        await drop_connection(request)
    if kind == "500":
        raise APIError(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
    if kind == "content-filter":
        return json_response(content_filter_body(fault.reason), status=400)
    if kind == "503":
        body = error_body(
            "The server is temporarily unable to serve requests, retry later.",
            err_type="ServiceUnavailableError",
            status=503,
        )
    else:
        body = error_body(
            "The server is overloaded, retry later.", err_type="RateLimitError", status=429
        )
    headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else None
    return json_response(body, status=int(kind), headers=headers)


def content_filter_body(reason: str) -> dict:
    """OpenAI's (and Azure OpenAI's) refusal of a prompt on its content policy."""
    return {
        "error": {
            "message": "The response was filtered due to the prompt triggering the content "
            f"management policy ({reason}). Please modify your prompt and retry.",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": "content_filter",
        }
    }


def late_fault(sim, fault: Fault | None, *, prefill: bool) -> Fault | None:
    """After the request is parsed: the fault that strikes its generation (a stream fault), or
    None. `no-prefill` is raised here; `context-length` is the route's, which knows the prompt."""
    if fault is None:
        return None
    if fault.kind == "no-prefill":
        if prefill and sim.faults.take(fault):
            raise APIError(NO_PREFILL_MESSAGE)
        return None
    if fault.kind in STREAM_FAULTS and sim.faults.take(fault):
        return fault
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
