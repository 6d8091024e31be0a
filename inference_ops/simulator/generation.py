"""What a request will generate, decided up front.

The engine only paces tokens out; which tokens, and why generation stops, is
settled here when the request arrives. Knowing the whole output in advance
lets stop strings be cut exactly (no partial stop string is ever streamed)
without the look-ahead buffering a real detokenizer needs.
"""

import random
from dataclasses import dataclass

from .tokenizer import tokenize

RANDOM_LENGTH = (8, 64)  # tokens, when the request sets no max_tokens: the model "hits EOS"

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no what up out "
    "more time model answer token stream server engine request response value system data user "
    "question context result simple fast small large first last next other new good great long "
    "little right early young important public able bad same few make know take see come think "
    "look want give use find tell ask work seem feel try leave call keep begin show hear play run "
    "move live believe bring happen write provide sit stand lose pay meet include continue set "
    "learn change lead understand watch follow stop create speak read"
).split()


@dataclass(frozen=True)
class PlannedOutput:
    tokens: list[
        str
    ]  # text each generated token shows the client (empty once inside a stop string)
    finish_reason: str  # "stop" or "length", as in the OpenAI API
    stop_reason: str | None = None  # the stop string that ended generation, as vLLM reports it

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def plan_output(
    *,
    mode: str,
    rng: random.Random,
    echo_text: str | None,
    max_tokens: int | None,
    room: int,
    stop: list[str],
    include_stop_str_in_output: bool = False,
    content_tokens: list[str] | None = None,
    skip: int = 0,
) -> PlannedOutput:
    """Plan the completion of one request.

    `room` is what the context window leaves after the prompt; it caps the
    output when the request gives no max_tokens (vLLM's default max_tokens).
    `content_tokens` is a structured answer or a tool call, decided by the
    caller: the model writes it and stops, in either mode.
    `skip` is the length in tokens of an assistant prefill being continued
    (`continue_final_message`): the model plans its whole answer and writes
    what comes after those tokens, so an answer cut and continued with the
    same seed reads as the uncut one.
    """
    limit = max_tokens if max_tokens is not None else room
    if content_tokens is not None:
        tokens = content_tokens[skip:] or [""]
        finish = "stop"
    elif mode == "echo" and echo_text is not None:
        tokens = tokenize(echo_text)[skip:] or [""]  # an empty prompt still "generates" EOS
        finish = "stop"
    elif max_tokens is not None:
        # A requested length is honoured exactly: the model never stops early.
        tokens = _random_tokens(rng, skip + max_tokens)[skip:]
        finish = "length"
    else:
        tokens = _random_tokens(rng, rng.randint(*RANDOM_LENGTH))[skip:] or [""]
        finish = "stop"
    if len(tokens) > limit:
        tokens, finish = tokens[:limit], "length"
    return _apply_stop(tokens, finish, stop, include_stop_str_in_output)


def filler_text(*, mode: str, rng: random.Random, echo_text: str | None) -> str:
    """What the model would say, to fill the strings of a structured answer or a tool call:
    the echoed text in echo mode, a few random words otherwise."""
    if mode == "echo" and echo_text is not None:
        return echo_text
    return "".join(_random_tokens(rng, rng.randint(2, 6)))


def _random_tokens(rng: random.Random, count: int) -> list[str]:
    tokens: list[str] = []
    sentence_start = True
    for i in range(count):
        # Every token is a whole word (with its leading space) or one punctuation
        # mark, so the tokenizer splits the joined text back into these tokens.
        if i > 0 and not sentence_start and tokens[-1][-1].isalnum() and rng.random() < 0.12:
            mark = "." if rng.random() < 0.5 else ","
            tokens.append(mark)
            sentence_start = mark == "."
            continue
        word = rng.choice(_WORDS)
        if sentence_start:
            word = word.capitalize()
        tokens.append(word if i == 0 else " " + word)
        sentence_start = False
    return tokens


def _apply_stop(tokens: list[str], finish: str, stop: list[str], include: bool) -> PlannedOutput:
    text = "".join(tokens)
    best: tuple[int, int, str] | None = None  # (end, start, stop string)
    for s in stop:
        if not s:
            continue
        start = text.find(s)
        if start >= 0 and (best is None or (start + len(s), start) < best[:2]):
            best = (start + len(s), start, s)
    if best is None:
        return PlannedOutput(tokens=tokens, finish_reason=finish)

    end, start, matched = best
    cut = end if include else start
    kept: list[str] = []
    offset = 0
    # Generation stops with the token that completes the stop string; text from
    # the stop string on is hidden, even the part that came in earlier tokens.
    for token in tokens:
        if offset >= end:
            break
        kept.append(token[: max(0, cut - offset)])
        offset += len(token)
    return PlannedOutput(tokens=kept, finish_reason="stop", stop_reason=matched)
