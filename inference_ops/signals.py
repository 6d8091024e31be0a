"""What inference_ops tells the layers above it, which it does not import."""

from django.dispatch import Signal

# Sent after commit when an engine becomes ready (started, restarted, recovered or adopted), with
# `engine` (the EngineProcess row) and `endpoint` (the name of the endpoint it serves); also when
# an endpoint no engine row runs (a router) answers its check again, with `engine` None.
engine_ready = Signal()
