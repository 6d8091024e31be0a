"""/v1/completions: OpenAI's legacy completions of a raw prompt, beside chat.

It yields the pipeline's events (`routing.events`), so the interfaces, the request log and the
metrics read them as they read a chat answer's: `route`, tokens, then `done`; or an `error`.

A completion is routed as a chat question is, with no knowledge base: the rule that takes the
prompt's text decides (a named endpoint must be listed by it; `auto` tries the rule's chain), its
token ceiling applies, and the chain is tried by the chat answer's own `routing.chain._generate`
(breaker, replicas, fallback before the first token, the limits' reservation and settlement). The
prompt goes to the engine as the client sent it: no system prompt, no passages.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncGenerator

from django.conf import settings

from inference_ops.other_apis import stream_completion
from privacy.policy import DEFAULT as DEFAULT_PRIVACY
from routing.attempt import Attempt
from routing.chain import generate
from routing.compiled import Snapshot
from routing.events import Error, Event, RouteRequest
from routing.pipeline import Named, matched_rule, named_route, order_targets, rules_for
from routing.plan import Plan, answer_budget
from routing.prompt import approx_tokens
from routing.screening import screen

COMPLETIONS = "completions"

_rng = random.Random()  # noqa: S311 - a weighted pick of targets, not a secret


async def complete(
    request: RouteRequest, prompt: str | list, *, rng: random.Random | None = None
) -> AsyncGenerator[Event, None]:
    """A raw completion of `prompt`, sent as the client sent it (a string, a list of one, token
    ids); its text in `request.text` for the rules ("" for token ids), the client's other fields
    in `request.passthrough.fields`."""
    started = time.monotonic()
    rng = rng or _rng
    text = request.text
    ids = _token_ids(prompt)
    if max(len(text), ids) > settings.ROUTING_MAX_INPUT_CHARS:
        size = f"{len(text)} characters" if text else f"{ids} tokens"
        yield Error(
            code="too_long",
            message=f"The prompt has {size}; the limit is {settings.ROUTING_MAX_INPUT_CHARS}.",
            param="prompt",
        )
        return
    snap = await rules_for(request)
    named = bool(request.model) and request.model != "auto"
    chosen = await (
        named_route(snap, request, text, rng) if named else _rule_route(snap, request, rng)
    )
    if isinstance(chosen, Error):
        yield chosen
        return
    rule, targets, why, specs = chosen
    fields = request.passthrough.fields
    suffix = fields.get("suffix")
    tokens = (approx_tokens(text) if text else ids) + (
        approx_tokens(suffix) if isinstance(suffix, str) else 0
    )
    plan = Plan(
        request=request,
        text=text,
        rule=rule,
        targets=targets,
        started=started,
        why=why,
        named=named,
        direct=None,
        kb=None,
        max_tokens=answer_budget(request.max_tokens, rule),
        temperature=(
            request.temperature
            if request.temperature is not None
            else (rule.temperature if rule else None)
        ),
        system="",
        context="",
        citations=[],
        prompt_tokens=tokens,
        fixed_tokens=tokens,  # a raw prompt has no history to trim
        personal=(request.screening or screen(request, DEFAULT_PRIVACY)).personal,
    )

    def attempt_of(*args) -> _Completion:
        return _Completion(*args, prompt=prompt)

    async for event in generate(
        request,
        text,
        rule,
        targets,
        started,
        why=why,
        rng=rng,
        specs=specs,
        plan=plan,
        attempt_of=attempt_of,
    ):
        yield event


def _token_ids(prompt: str | list) -> int:
    """How many token ids a prompt of token ids holds (a list of them, or a list of one list);
    0 for a text prompt."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return 0


class _Completion(Attempt):
    """One target's try at a completion: the prompt as the client sent it, to /v1/completions."""

    def __init__(self, *args, prompt: str | list):
        super().__init__(*args)
        self.prompt = prompt

    def stream(self):
        plan = self.plan
        self.meter.begin(self.target, [{"content": plan.text}] if plan.text else [], self.text)
        return stream_completion(
            self.target.config,
            self.prompt,
            max_tokens=plan.max_tokens,
            temperature=plan.temperature,
            fields=plan.request.passthrough.fields,
        )


async def _rule_route(snap: Snapshot, request: RouteRequest, rng: random.Random) -> Named | Error:
    """The chain of the rule that takes a raw prompt, or why none does: a KB-only rule has no
    answer to a completion."""
    matched = await matched_rule(snap, request, request.text, None)
    if isinstance(matched, Error):
        return matched
    rule, why, specs = matched
    if rule is None:
        return Error(
            code="no_route", message="No routing rule matches and there is no default rule."
        )
    if rule.action != "generate":
        return Error(
            code="model_not_allowed",
            message=f"Rule {rule.name!r} answers from the knowledge base only, and a completion "
            "of a raw prompt is no question it answers.",
            rule=rule.name,
        )
    targets = order_targets(rule, rng)
    if not targets:
        return Error(
            code="no_target", message=f"Rule {rule.name} has no active target.", rule=rule.name
        )
    return Named(rule, targets, why, specs)
