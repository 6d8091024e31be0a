"""vLLM 0.32's generation responses, byte for byte where clients could tell.

Streamed chunks are pydantic models dumped with exclude_unset (chat_completion/serving.py,
completion/serving.py), so a chunk carries exactly the fields vLLM set: the role chunk its
`prompt_token_ids` and `prompt_text` (null), every choice its `token_ids` (null), a finishing
choice its `stop_reason`, the finishing chunk the `system_fingerprint` unless a usage chunk
follows (then the usage chunk has it), and the usage chunk drops nulls. Whole responses are
model_dump()s: every field, nulls included; a message without tool calls has no `tool_calls`.
"""

import functools
import json
import time

from . import logprobs as lp
from .errors import ENGINE_ERROR_MESSAGE, dumps, error_body
from .generation import PlannedOutput
from .tools import ToolStream


class ChunkWriter:
    """The SSE chunks of one streamed request.

    The constant part of every chunk is rendered once; on the plain path (one choice, text, no
    logprobs) only the token text is JSON-encoded per chunk, which keeps hundreds of streams
    cheap. Other requests build each choice and encode it whole (`chunk`).
    """

    DONE = b"data: [DONE]\n\n"

    def __init__(
        self, *, endpoint: str, model: str, request_id: str, fingerprint: str, include_usage: bool
    ):
        self.chat = endpoint == "chat"
        self.model = model
        self.request_id = request_id
        self.fingerprint = fingerprint
        self.include_usage = include_usage
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        head = dumps({"id": request_id, "object": obj, "created": int(time.time()), "model": model})
        self._head = "data: " + head[:-1] + ',"choices":['
        # The finishing chunk names the system fingerprint, unless the usage chunk will.
        self._last = (
            "]" if include_usage else "]," + dumps({"system_fingerprint": fingerprint})[1:-1]
        )
        if self.chat:
            self._open = '{"index":0,"delta":{"content":'
            self._mid = '},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            self._end = ('},"logprobs":null,"finish_reason":', ',"token_ids":null}')
        else:
            self._open = '{"index":0,"text":'
            self._mid = (
                ',"logprobs":null,"finish_reason":null,"stop_reason":null,'
                '"prompt_token_ids":null,"token_ids":null}]}\n\n'
            )
            self._end = (
                ',"logprobs":null,"finish_reason":',
                ',"prompt_token_ids":null,"token_ids":null}',
            )

    def roles(self, n: int = 1) -> bytes:
        # vLLM opens a chat stream with one assistant-role chunk per choice, content empty.
        return b"".join(
            (
                self._head + f'{{"index":{i},"delta":{{"role":"assistant","content":""}},'
                '"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,'
                '"prompt_text":null}\n\n'
            ).encode()
            for i in range(n)
        )

    def delta(
        self, text: str, finish_reason: str | None = None, stop_reason: str | None = None
    ) -> bytes:
        """A plain-path chunk of choice 0: its text, and how it ended on the last one."""
        if finish_reason is None:
            return (self._head + self._open + _json_text(text) + self._mid).encode()
        return (
            self._head
            + self._open
            + _json_text(text)
            + self._end[0]
            + dumps(finish_reason)
            + ',"stop_reason":'
            + dumps(stop_reason)
            + self._end[1]
            + self._last
            + "}\n\n"
        ).encode()

    def chunk(self, choice: dict) -> bytes:
        last = self._last if choice.get("finish_reason") is not None else "]"
        return (self._head + dumps(choice) + last + "}\n\n").encode()

    def usage(self, body: dict) -> bytes:
        usage = {
            "prompt_tokens": body["prompt_tokens"],
            "total_tokens": body["total_tokens"],
            "completion_tokens": body["completion_tokens"],
        }
        details = body.get("prompt_tokens_details")
        if details is not None:  # dumped with exclude_none
            usage["prompt_tokens_details"] = {k: v for k, v in details.items() if v is not None}
        tail = dumps({"usage": usage, "system_fingerprint": self.fingerprint})[1:]
        return (self._head + "]," + tail + "\n\n").encode()

    @staticmethod
    def error(body: dict | None = None) -> bytes:
        # vLLM writes stream errors with json.dumps' default separators, unlike its chunks.
        if body is None:
            body = error_body(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
        return f"data: {json.dumps(body)}\n\n".encode()


@functools.lru_cache(maxsize=8192)
def _json_text(text: str) -> str:
    # Generated tokens come from a small vocabulary: encode each string once, not once per chunk
    # per stream.
    return dumps(text)


class StreamedChoice:
    """One choice of a stream off the plain path: its chunks as vLLM cuts them."""

    def __init__(
        self,
        *,
        chat: bool,
        index: int,
        output: PlannedOutput,
        tool_stream: ToolStream | None,
        top_logprobs: int | None,
        echo: str = "",
    ):
        self.chat = chat
        self.echo = echo  # a completion's echoed prompt: the first chunk's text starts with it
        self.index = index
        self.output = output
        self.tool_stream = tool_stream
        self.top_logprobs = top_logprobs
        self.text_end = 0  # characters generated so far
        self.text_offset = len(echo)  # where the next token starts, for the legacy logprobs

    def render(self, start: int, end: int, engine_reason: str | None) -> dict | None:
        """The choice for tokens [start, end), the last ones when `engine_reason` is set; None
        when vLLM sends nothing for them."""
        tokens = self.output.tokens[start:end]
        text = "".join(tokens)
        self.text_end += len(text)
        logprobs = None
        if self.top_logprobs is not None:
            if self.chat:
                logprobs = {"content": lp.chat_content(tokens, start, self.top_logprobs)}
            else:
                logprobs = lp.completion(tokens, start, self.top_logprobs, self.text_offset)
                self.text_offset += len(text)
        if not self.chat:
            text, self.echo = self.echo + text, ""
            return {
                "index": self.index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": engine_reason,
                "stop_reason": self.output.stop_reason if engine_reason else None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        if self.tool_stream is not None:
            delta = self.tool_stream.delta(self.text_end, text)
        else:
            delta = {"content": text}
        if delta is None:
            # A step the parser holds back: vLLM skips it, unless it ends the choice or carries
            # logprobs, which go out with an empty delta.
            if engine_reason is None and logprobs is None:
                return None
            delta = {}
        choice = {"index": self.index, "delta": delta, "logprobs": logprobs}
        if engine_reason is None:
            choice["finish_reason"] = None
        else:
            if self.tool_stream is not None:
                engine_reason = self.tool_stream.finish_reason(engine_reason)
            choice["finish_reason"] = engine_reason
            choice["stop_reason"] = self.output.stop_reason
        choice["token_ids"] = None
        return choice


def usage_info(
    prompt_tokens: int, completion_tokens: int, prompt_tokens_details: dict | None = None
) -> dict:
    """UsageInfo as model_dump() gives it."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": prompt_tokens_details,
        "completion_tokens_details": None,
    }


def chat_choice(
    *,
    index: int,
    content: str | None,
    tool_calls: list[dict],
    logprobs: list[dict] | None,
    finish_reason: str,
    stop_reason: str | None,
) -> dict:
    message: dict[str, object] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls:  # ChatMessage drops an empty list when it is serialized
        message["tool_calls"] = tool_calls
    message["reasoning"] = None
    return {
        "index": index,
        "message": message,
        "logprobs": None if logprobs is None else {"content": logprobs},
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "routed_experts": None,
    }


def completion_choice(
    *, index: int, text: str, logprobs: dict | None, finish_reason: str, stop_reason: str | None
) -> dict:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


def full_response(
    *,
    endpoint: str,
    request_id: str,
    model: str,
    choices: list[dict],
    usage: dict,
    fingerprint: str,
) -> dict:
    response = {
        "id": request_id,
        "object": "chat.completion" if endpoint == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage,
    }
    if endpoint == "chat":
        response |= {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
    return response | {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
