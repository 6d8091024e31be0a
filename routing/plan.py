"""What generating one answer needs, settled once before the first target is tried (`Plan`):
the rule's prompt and the client's, this question's KB passages, the token ceiling
(`answer_budget`), the prompt's size; and whether the request as it is fits a given target at all
(`target_refusal`: the API it asks, the personal data it holds, the fields it sends, the window),
or fits it redacted (`Plan.redaction_for`, where the rule allows it).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from inference_ops import openai_fields
from knowledge.selectors import acontext_passages
from knowledge.verdict import DirectAnswer
from privacy.injection import suspected
from privacy.policy import DEFAULT as DEFAULT_PRIVACY
from privacy.redaction import Redaction
from routing.compiled import CompiledRule, Target
from routing.events import PLAIN, Error, KbLookup, RouteRequest
from routing.prompt import (
    PROMPT_OVERHEAD,
    approx_tokens,
    fields_tokens,
    message_tokens,
    passages_block,
    system_message,
)
from routing.screening import screen


@dataclass
class Plan:
    """What generating one answer needs, settled once before the first target is tried: the
    request, the rule and its chain, the prompt's parts, the token ceiling."""

    request: RouteRequest
    text: str
    rule: CompiledRule | None
    targets: list[Target]
    started: float
    why: str
    named: bool
    direct: DirectAnswer | None
    kb: KbLookup | None
    max_tokens: int
    temperature: float | None
    system: str  # the system message: the rule's prompt, the client's, the passages' instruction
    context: str  # this question's passages
    citations: list[dict]
    prompt_tokens: int  # the prompt's estimate with the whole history (spend, window checks)
    fixed_tokens: int  # what of it never trims: system, question, what follows it, tools
    # The personal data types in what the engine would be sent (routing.screening), sorted.
    personal: tuple[str, ...] = ()
    # The request's placeholders, made by the first attempt that redacts (`redaction_for`).
    redaction: Redaction | None = None

    @property
    def may_redact(self) -> bool:
        """The rule lets an external target that may not receive the question's personal data
        have it redacted. A text answer only: placeholders in a tool call's arguments, a schema's
        JSON or logprobs would reach the client as they are."""
        passthrough = self.request.passthrough
        return (
            self.rule is not None
            and self.rule.redact_personal_data
            and self.request.api == "chat"
            and passthrough.not_plain is None
            and not passthrough.fields.get("tools")
            and not passthrough.fields.get("functions")
        )

    def withheld(self, target: Target) -> tuple[str, ...]:
        """The question's personal data types `target` may not receive."""
        if not self.personal or target.road == "local":
            return ()
        return tuple(kind for kind in self.personal if kind not in target.personal_data)

    def redaction_for(self, target: Target) -> Redaction | None:
        """The request's redaction when `target` gets the question redacted, else None."""
        if not self.withheld(target) or not self.may_redact:
            return None
        if self.redaction is None:
            policy = (self.request.screening or screen(self.request, DEFAULT_PRIVACY)).policy
            self.redaction = Redaction(types=policy.types, thresholds=policy.threshold_of or None)
        return self.redaction

    @property
    def rule_name(self) -> str | None:
        return self.rule.name if self.rule else None

    @property
    def completion_tokens(self) -> int:
        """The answer's ceiling: max_tokens for each of the choices asked for."""
        return self.max_tokens * self.request.passthrough.choices


async def build_plan(
    request: RouteRequest,
    text: str,
    rule: CompiledRule | None,
    targets: list[Target],
    started: float,
    *,
    why: str,
    direct: DirectAnswer | None,
) -> Plan:
    """The answer's prompt parts and ceilings: the rule's prompt and the client's, this question's
    KB passages, the token ceiling, the prompt's size."""
    passthrough = request.passthrough
    passages = []
    if rule is not None and rule.use_kb_context and text.strip():
        query = (
            (direct.model, direct.vector)
            if direct is not None and direct.model is not None and direct.vector is not None
            else None
        )
        passages = await acontext_passages(text, k=rule.context_k, query=query)
    screening = request.screening or screen(request, DEFAULT_PRIVACY)
    if passages and screening.policy.screen_passages:
        kept = [p for p in passages if suspected(p.text) is None]
        if left := [p.label for p in passages if p not in kept]:
            why = f"{why}; KB passages left out, read as a prompt injection: {', '.join(left)}"
            passages = kept
    prompt = (rule.system_prompt if rule else "") or settings.ROUTING_SYSTEM_PROMPT
    if request.system:
        prompt = f"{prompt}\n\n{request.system}"
    system = system_message(prompt, with_passages=rule is not None and rule.use_kb_context)
    context = passages_block(passages)
    fixed = (
        PROMPT_OVERHEAD
        + message_tokens({"content": system})
        + approx_tokens(context)
        + message_tokens(question_message(request) or {})
        + sum(map(message_tokens, passthrough.after))
        + fields_tokens(passthrough.fields)
    )
    if passthrough.not_plain is not None and passthrough is not PLAIN:
        why = f"{why}; the knowledge base was not asked: {passthrough.not_plain}"
    if personal := screening.personal:
        held = ", ".join(personal)
        why = f"{why}; holds personal data ({held}): only targets that may receive it"
    return Plan(
        request=request,
        text=text,
        rule=rule,
        targets=targets,
        started=started,
        why=why,
        named=bool(request.model) and request.model != "auto",
        direct=direct,
        kb=KbLookup.of(direct) if direct is not None else None,
        max_tokens=answer_budget(request.max_tokens, rule),
        temperature=(
            request.temperature
            if request.temperature is not None
            else (rule.temperature if rule else None)
        ),
        system=system,
        context=context,
        citations=[{"entry_id": p.entry_id, "label": p.label} for p in passages],
        prompt_tokens=fixed + sum(map(message_tokens, request.history)),
        fixed_tokens=fixed,
        personal=personal,
    )


def question_message(request: RouteRequest) -> dict | None:
    """The question message as the client sent it (its parts), or as its text."""
    if request.passthrough is PLAIN:
        return {"role": "user", "content": request.text}
    return request.passthrough.question


def target_refusal(plan: Plan, target: Target) -> tuple[str, Error] | None:
    """Why the request as it is cannot go to this target (a note for the route's explanation,
    and the error if no target can take it), or None."""
    if (api := plan.request.api) not in target.apis:
        return f"serves no {api}", Error(
            code="unsupported_api",
            message=f"{target.endpoint} serves {', '.join(sorted(target.apis))}, not {api}.",
            param="model",
            rule=plan.rule_name,
            target=target.endpoint,
            road=target.road,
        )
    if (held := plan.withheld(target)) and not plan.may_redact:
        named = ", ".join(held)
        return f"may not receive personal data ({named})", Error(
            code="personal_data",
            message=(
                f"The question holds personal data ({named}) that {target.endpoint} may not "
                "receive, and no target that may is answering. Ask without it, or again when "
                "the local model is up."
            ),
            rule=plan.rule_name,
            target=target.endpoint,
            road=target.road,
        )
    limited = plan.request.passthrough.limited
    if limited and (name := openai_fields.field_refused(limited, target.kind)) is not None:
        return f"takes no {name}", Error(
            code="unsupported_parameter",
            message=openai_fields.refusal_for(name, limited[name], target.kind, target.endpoint),
            param=name.split(" ")[0],
            rule=plan.rule_name,
            target=target.endpoint,
            road=target.road,
        )
    if plan.fixed_tokens + 8 > target.context_window - plan.max_tokens:
        return f"the question does not fit its {target.context_window}-token window", Error(
            code="too_long",
            rule=plan.rule_name,
            target=target.endpoint,
            road=target.road,
            message=(
                f"The question is about {plan.fixed_tokens} tokens; {target.endpoint} accepts "
                f"at most {target.context_window} tokens, {plan.max_tokens} of them kept for the "
                "answer."
            ),
        )
    return None


def answer_budget(asked: int | None, rule: CompiledRule | None) -> int:
    """The max_tokens an engine is sent. The rule's value is the operator's ceiling on spend (and
    the length of an answer nobody asked a length for); under a rule without one, the gateway's
    ceiling caps and its default applies. A client may ask for less, never for more."""
    if rule is not None and rule.max_tokens:
        ceiling, default = rule.max_tokens, rule.max_tokens
    else:
        ceiling, default = settings.ROUTING_MAX_TOKENS_CEILING, settings.ROUTING_DEFAULT_MAX_TOKENS
    return min(asked, ceiling) if asked else min(default, ceiling)
