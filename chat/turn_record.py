"""What a turn leaves in the request log when it ends: its status, its times (the gateway's own
overhead among them) and its record (observability.requestlog). The /v1 calls that are no turn
(chat.openai_api.calls) record theirs the same way."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from django.utils import timezone

from chat.models import Message
from observability.requestlog import RequestRecord
from routing import events


def turn_status(final: events.Event | None, cancelled: bool, produced: bool) -> str:
    if isinstance(final, events.Done):
        return Message.Status.COMPLETE
    if cancelled:
        return Message.Status.CANCELLED
    if isinstance(final, events.Error) and final.partial:
        return Message.Status.PARTIAL
    return Message.Status.PARTIAL if produced else Message.Status.FAILED


def overhead_ms(arrived: float, engine_ms: float | None) -> float:
    """The gateway's own time since the request arrived: all of it, less the engine's share."""
    return round(max(0.0, (time.monotonic() - arrived) * 1000 - (engine_ms or 0.0)), 1)


def _ms_since(arrived: float, then: float | None) -> float | None:
    return None if then is None else round((then - arrived) * 1000, 1)


def turn_log_row(
    *,
    arrived: float,
    first_token_at: float | None,
    interface: str,
    user_id: int | None,
    api_key_id: int | None,
    session_id: int | None,
    status: str,
    route: events.Route | None,
    done: events.Done | None,
    error: events.Error | None,
    key: uuid.UUID,
    spent: events.Spent,
    features: tuple[str, ...] = (),
) -> RequestRecord:
    now = time.monotonic()
    source = done or error
    kb = source.kb if source is not None else None
    where = route or error
    usage = done.usage if done is not None and done.usage else {}
    road = (where.road if where else "") or ""
    elapsed = round((now - arrived) * 1000, 1)
    if done is not None:
        overhead = done.overhead_ms
    elif (route is None or route.road == "kb") and not (
        error is not None and (error.target or error.fell_back_from)
    ):
        overhead = elapsed  # no engine took part: all of it was the gateway's
    else:
        overhead = (
            None  # an engine's attempt is in there, and it ended before saying how long it took
        )
    return RequestRecord(
        at=timezone.now() - timedelta(seconds=now - arrived),
        interface=interface,
        user_id=user_id,
        api_key_id=api_key_id,
        session_id=session_id,
        road=road,
        rule=(where.rule if where else "") or "",
        target=(where.target if where else "") or "",
        status=status,
        error_code=error.code if error is not None else "",
        ttft_ms=_ms_since(arrived, first_token_at),
        latency_ms=elapsed,
        overhead_ms=overhead,
        prompt_tokens=usage.get("prompt_tokens", spent.prompt_tokens),
        completion_tokens=usage.get("completion_tokens", spent.completion_tokens),
        cost=0.0 if road == "kb" else spent.cost,
        kb_method=kb.method if kb else "",
        kb_hit=bool(kb and kb.hit),
        kb_entry_id=kb.entry_id if kb else None,
        kb_score=kb.score if kb else None,
        fell_back_from=source.fell_back_from if source is not None else (),
        retried=source.retried if source is not None else (),
        skipped_chunks=done.skipped_chunks if done is not None else 0,
        continued=done.continued if done is not None else (),
        features=" ".join((*features, "tool_calls") if spent.tool_calls else features),
        key=key,
        wait_ms=round(spent.waited * 1000, 1) if spent.waited else None,
        priority=spent.priority,
        personal_data=" ".join(spent.personal_data),
        personal_data_action=spent.personal_data_action or _refused_for(error, "personal_data"),
        injection=spent.injection,
        injection_action=spent.injection_action or _refused_for(error, "prompt_injection"),
    )


def _refused_for(error: events.Error | None, code: str) -> str:
    # A refusal for what the screening found is one whatever path raised it: a refusal the
    # pipeline did not note in `spent` must not read in the log as data that went nowhere.
    return "refused" if error is not None and error.code == code else ""
