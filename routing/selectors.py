"""Reads for operators: why a question would take the road it takes, without generating."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from inference_ops.models import ModelEndpoint
from knowledge.selectors import direct_answer
from routing import breaker
from routing.rules import Context, asnapshot, named_target, query_vector


async def route_explain(
    *,
    text: str,
    groups: frozenset[str] = frozenset(),
    client: str = "web",
    model: str | None = None,
) -> dict:
    """The decision for `text`: KB verdict and top matches, every rule with match / no match
    and why, and the chosen chain with each endpoint's health and breaker state."""
    snap = await asnapshot()
    kb = await sync_to_async(direct_answer)(text, with_matches=True)
    ctx = Context(text=text, groups=groups, client=client, model=model)
    if any(rule.needs_vector for rule in snap.rules):
        ctx.vector = await query_vector(text)
    rules, chosen = [], None
    for rule in snap.rules:
        matched, reasons = rule.evaluate(ctx)
        rules.append(
            {
                "rule": rule.name,
                "priority": rule.priority,
                "default": rule.is_default,
                "action": rule.action,
                "matched": matched,
                "why": reasons,
                "chosen": matched and chosen is None,
            }
        )
        if matched and chosen is None:
            chosen = rule

    if model and model != "auto":
        target, refusal = (
            named_target(chosen, model)
            if model in snap.targets_by_model
            else (None, f"no model named {model!r}")
        )
        rule_name = chosen.name if chosen else None
        decision = (
            {
                "road": target.road,
                "reason": f"model {model} requested, allowed by rule {rule_name}",
                "rule": rule_name,
            }
            if target
            else {"road": None, "reason": refusal, "rule": rule_name}
        )
        chain_targets = [[target]] if target else []
    elif kb.hit and kb.entry is not None:
        decision = {"road": "kb", "reason": kb.reason, "rule": None, "entry_id": kb.entry.pk}
        chain_targets = [list(group) for group in chosen.chain] if chosen else []
    elif chosen is None:
        decision = {
            "road": None,
            "reason": "no rule matches and there is no default rule",
            "rule": None,
        }
        chain_targets = []
    elif chosen.action == "kb_only":
        decision = {
            "road": "kb",
            "reason": f"rule {chosen.name} is KB-only: {kb.reason}",
            "rule": chosen.name,
        }
        chain_targets = []
    else:
        first = chosen.chain[0][0] if chosen.chain else None
        decision = {
            "road": first.road if first else None,
            "rule": chosen.name,
            "reason": f"rule {chosen.name}" + ("" if first else " has no active target"),
        }
        chain_targets = [list(group) for group in chosen.chain]

    endpoints = await sync_to_async(lambda: {e.pk: e for e in ModelEndpoint.objects.all()})()
    breakers = await breaker.states([t.endpoint for group in chain_targets for t in group])
    chain = []
    for group in chain_targets:
        total = sum(t.weight for t in group) or 1
        for target in group:
            endpoint = endpoints.get(target.endpoint_id)
            state = breakers[target.endpoint]
            chain.append(
                {
                    "position": target.position,
                    "endpoint": target.endpoint,
                    "road": target.road,
                    "model": target.config.model,
                    "share": round(target.weight / total, 3),
                    "health": endpoint.status if endpoint else "gone",
                    "health_reason": endpoint.status_reason if endpoint else "",
                    "breaker": state.state,
                    "breaker_failures": state.failures,
                    "breaker_retry_in": None
                    if state.retry_in is None
                    else round(state.retry_in, 1),
                }
            )
    return {
        "text": text,
        "decision": decision,
        "kb": {
            "hit": kb.hit,
            "method": kb.method,
            "reason": kb.reason,
            "threshold": kb.threshold,
            "margin": None if kb.margin is None else round(kb.margin, 4),
            "matches": [
                {
                    "entry_id": m.entry.pk,
                    "question": m.entry.question,
                    "phrasing": m.phrasing,
                    "score": round(m.score, 4),
                }
                for m in kb.matches
            ],
        },
        "rules": rules,
        "chain": chain,
    }
