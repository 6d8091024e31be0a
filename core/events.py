"""Operations events fanned out to staff WebSockets through the Redis channel layer.

Lower layers call `ops_event_broadcast` (inside `transaction.on_commit`) when an
engine changes state or a bulk job progresses; `observability.consumers.OpsConsumer`
relays the event to every connected staff browser.
"""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

OPS_GROUP = "ops"


async def ops_event_abroadcast(*, kind: str, data: dict) -> None:
    # CHANNEL_LAYERS is always set (config.settings.databases), so there is a layer.
    await get_channel_layer().group_send(  # type: ignore[union-attr]
        OPS_GROUP, {"type": "ops.event", "kind": kind, "data": data}
    )


def ops_event_broadcast(*, kind: str, data: dict) -> None:
    async_to_sync(ops_event_abroadcast)(kind=kind, data=data)
