"""An OpenAI-compatible API: `GET /v1/models`, `POST /v1/chat/completions`, and OpenAI's legacy
`POST /v1/completions` and `POST /v1/embeddings`.

The official `openai` SDK works unchanged with `base_url=…/v1` and an API key with the
`chat` scope. `model: "auto"` routes by the rules (KB answers included); a model name
from /v1/models asks for that target, where the rule that takes the question lists it.
Every response carries X-Route, X-Route-Rule and X-Route-Target. Errors have OpenAI's shape:
{"error": {"message", "type", "param", "code"}}; an engine failure's message is a plain one
unless the key's user may read the routing rules (chat.turns.reads_route_details).

The modules, top down: `transport` (the bare ASGI application config.asgi sends `/v1/` to),
`handlers` (one per endpoint), `schema` (the request as this API reads it), `completion` (a
turn's events as OpenAI's response, streamed or whole), `replies` (the Reply a handler
returns, and every failure in OpenAI's error shape) and `ratelimit` (the caller's limits as
OpenAI's x-ratelimit-* headers); for the APIs that store no chat message,
`completions_api` and `text_completion` (a raw completion), `embeddings_api`, and `calls` (their
admission, request-log row and metrics).
"""

from chat.openai_api.transport import application

__all__ = ["application"]
