"""Log probabilities of the generated tokens, in vLLM's two shapes: the chat one
(`choices[].logprobs.content[]`: token, logprob, bytes, top_logprobs) and the legacy completions
one (`text_offset`, `token_logprobs`, `tokens`, `top_logprobs` as token -> logprob maps).

The numbers are made up but consistent: a token's logprob depends only on the token and its
position, the sampled token is the most likely one (the simulator decodes greedily), and the
alternatives share what probability it leaves, so a step's probabilities never sum above one.
vLLM's per-step map lists the sampled token first, then the top-k by rank; with the sampled token
ranked first the two orders agree.
"""

import math
import zlib

# What the simulated engine allows, like vLLM's --max-logprobs (its default).
DEFAULT_MAX_LOGPROBS = 20

_ALTERNATIVES = (
    "the of and to in is that for it as was with be by on not this are or from at which but have "
    "an they you were one all we their has would when if so no what up out more time"
).split()


def step(token: str, position: int, top: int) -> tuple[float, list[tuple[str, float]]]:
    """The sampled token's logprob and the `top` most likely tokens of the step, best first
    (the sampled token among them when top > 0). The simulated vocabulary has a few dozen
    candidates per step: `top` beyond that, or -1 (all), lists them all."""
    seed = zlib.crc32(f"{position}:{token}".encode())
    p = 0.4 + 0.59 * (seed % 1000) / 1000  # the sampled token: 0.4 to 0.99
    logprob = round(math.log(p), 6)
    if top == -1 or top > len(_ALTERNATIVES):
        top = len(_ALTERNATIVES)
    if top <= 0:
        return logprob, []
    ranked = [(token, logprob)]
    space = " " if token.startswith(" ") else ""
    start = seed % len(_ALTERNATIVES)
    rest = 1 - p
    k = 0
    while len(ranked) < top:
        word = space + _ALTERNATIVES[(start + k) % len(_ALTERNATIVES)]
        k += 1
        if word == token:
            continue
        rest /= 2
        ranked.append((word, round(math.log(rest), 6)))
    return logprob, ranked


def chat_content(tokens: list[str], first_position: int, top: int) -> list[dict]:
    """`logprobs.content` entries for tokens generated from `first_position` on."""
    entries = []
    for offset, token in enumerate(tokens):
        logprob, ranked = step(token, first_position + offset, top)
        entries.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
                    for t, lp in ranked
                ],
            }
        )
    return entries


def completion(tokens: list[str], first_position: int, top: int, text_offset: int) -> dict:
    """The legacy shape; `text_offset` is where the first token starts in the whole answer.

    As in OpenAI's API, a step lists the sampled token plus the `top` most likely ones: with the
    sampled token ranked first that is `top` entries, and one when top is 0."""
    offsets, logprobs, tops = [], [], []
    for offset, token in enumerate(tokens):
        logprob, ranked = step(token, first_position + offset, max(top, 1))
        offsets.append(text_offset)
        text_offset += len(token)
        logprobs.append(logprob)
        tops.append(dict(ranked))
    return {
        "text_offset": offsets,
        "token_logprobs": logprobs,
        "tokens": list(tokens),
        "top_logprobs": tops,
    }
