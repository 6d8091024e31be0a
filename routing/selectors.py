"""Reads for operators: why a question would take the road it takes, without generating."""

from __future__ import annotations

import dataclasses

from asgiref.sync import sync_to_async
from django.apps import apps
from redis.exceptions import RedisError

from inference_ops import admission
from inference_ops.models import ModelEndpoint
from knowledge.selectors import direct_answer
from routing import breaker
from routing.compiled import Context, Target, named_target
from routing.events import RouteRequest
from routing.rules import asnapshot, query_vector
from routing.screening import screen

# What the caller gets when no room is found at the chain's last target within the deadline.
REFUSED_BUSY = (
    "a 429 rate_limit_exceeded with Retry-After (/v1 and the chat API), an error frame busy with "
    "retry_after on the socket"
)


def apikey_find(prefix: str):
    """The live API key with this prefix (the admin lists it), with its user; or None. Chat's
    model, named by its label: chat sits above routing and is never imported here."""
    return (
        apps.get_model("chat", "ApiKey")
        .objects.select_related("user")
        .filter(prefix=prefix, revoked_at__isnull=True)
        .first()
    )


def asker(*, user=None, key=None, client: str | None = None) -> dict:
    """Who asks, as route_explain takes it: a user's groups; an API key's owner's groups, its
    client and its own priority class. `client` given overrides the key's (else web)."""
    user = key.user if key is not None else user
    return {
        "groups": frozenset(user.groups.values_list("name", flat=True)) if user else frozenset(),
        "client": client or (key.client if key is not None else "web"),
        "priority": (key.priority or None) if key is not None else None,
        "api_key": key is not None,
    }


async def route_explain(
    *,
    text: str,
    groups: frozenset[str] = frozenset(),
    client: str = "web",
    model: str | None = None,
    priority: str | None = None,
    api_key: bool = False,
) -> dict:
    """The decision for `text`: KB verdict and top matches, every rule with match / no match
    and why, and the chosen chain with each endpoint's health and breaker state, and whether a
    request would wait now for room at its capacity. `priority`: the asking API key's own class;
    `api_key`: whether an API key asks (its default class is api, a person's interactive)."""
    snap = await asnapshot()
    kb = await sync_to_async(direct_answer)(text, with_matches=True)
    screening = screen(RouteRequest(text=text), snap.privacy)
    ctx = Context(
        text=text,
        groups=groups,
        client=client,
        model=model,
        personal=screening.personal,
        injection=screening.injection,
    )
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
        decision: dict[str, object] = (
            {
                "road": target.road,
                "reason": f"model {model} requested, allowed by rule {rule_name}",
                "rule": rule_name,
            }
            if target
            else {"road": None, "reason": refusal, "rule": rule_name}
        )
        # As the pipeline tries them (pipeline.named_chain): the endpoint named, then, unless the
        # rule pins named requests, the rest of its chain.
        chain_targets = [[dataclasses.replace(target, replicas=())]] if target else []
        if target and chosen is not None and not chosen.pin_named:
            chain_targets += [
                rest
                for group in chosen.chain
                if (rest := [t for t in group if t.endpoint != target.endpoint])
            ]
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
    klass, source = snap.class_of(own=priority, groups=groups, api_key=api_key)
    flat = [t for group in chain_targets for t in group]
    try:
        occupancy = await admission.occupancy(
            sorted({t.endpoint for t in flat if t.config.capacity})
        )
    except RedisError:
        occupancy = None
    chain: list[dict] = []
    for group in chain_targets:
        total = sum(t.weight for t in group) or 1
        for target in group:
            after = len(chain) + 1  # the next target in the order the pipeline tries them
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
                    "admission": _admission(
                        target,
                        None if occupancy is None else occupancy.get(target.endpoint),
                        klass,
                        then=_then(target, flat[after] if after < len(flat) else None),
                    ),
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
        "screening": {
            "personal_data": list(screening.personal),
            "injection": screening.injection,
            "injection_action": snap.privacy.injection_action if screening.injection else None,
        },
        "chain": chain,
        "priority": {
            "class": klass,
            "from": source,
            "deadline_seconds": admission.deadline_of(klass),
        },
    }


def _then(target: Target, following: Target | None) -> str:
    """Where a request goes when it found no room at `target` within its deadline."""
    then = f"the next target, {following.endpoint}" if following is not None else REFUSED_BUSY
    if len(target.replicas) > 1:  # the group's replicas are tried in turn (routing.replicas)
        then = f"the other replicas of its group (each with its own wait), then {then}"
    return then


def _admission(
    target: Target, now: admission.Occupancy | None, klass: str, *, then: str
) -> dict | None:
    """Would a request of class `klass` wait for room at the target now, and why; what happens
    to it past its class's deadline. None: the endpoint has no capacity (nothing waits)."""
    capacity = target.config.capacity
    if not capacity:
        return None
    deadline = admission.deadline_of(klass)
    shown = {
        "capacity": capacity,
        "held": None,
        "waiting": None,
        "would_wait": None,
        "why": "Redis could not be read: the slots held and the requests waiting are unknown",
        "past_deadline": f"after {deadline:g} s without room: {then}",
    }
    if now is None:
        return shown
    free = max(0, capacity - now.held)
    # Waiting requests of a class at least as good go first (those of the same class by fair
    # share, which may put this one before some of them: counted as ahead, the safe side).
    rank = admission.CLASSES.index(klass)
    ahead = sum(
        count for name, count in now.waiting.items() if admission.CLASSES.index(name) <= rank
    )
    if free == 0:
        why = f"all {capacity} slots are held"
    elif ahead >= free:
        why = f"{free} of {capacity} slots free, {ahead} waiting of class {klass} or better"
    else:
        why = f"{free} of {capacity} slots free"
        if ahead:
            why += f", {ahead} waiting of class {klass} or better"
    return {
        **shown,
        "held": now.held,
        "waiting": now.waiting,
        "would_wait": ahead >= free,
        "why": why,
    }
