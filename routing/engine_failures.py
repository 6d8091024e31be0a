"""A local engine that seems gone, reported to its supervisor at once.

A request that cannot connect to a local engine (or loses its stream) asks the supervisor to
check that endpoint's engines now, instead of waiting for the beat's next health check: a crashed
engine is restarted seconds sooner. The report never waits: a thread sends it, debounced per
process here and across processes by the task (`inference_ops.tasks`).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connections

from inference_ops.tasks import engines_check_after_failure

logger = logging.getLogger(__name__)

# Failures that say the engine process itself may be gone (not busy): its supervisor should look
# now.
ENGINE_GONE = frozenset({"connect", "timeout_connect", "stream_truncated"})
_failure_reported_at: dict[int, float] = {}
_check_requests = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-check")


def report_engine_failure(endpoint_id: int) -> None:
    """Ask the supervisor to check this endpoint's engines now, without waiting for it: a crashed
    engine is restarted seconds sooner than the next beat tick would notice. At most once per
    ENGINE_SUSPECT_SECONDS per endpoint and process (and across processes, by a Redis key)."""
    now = time.monotonic()
    if now - _failure_reported_at.get(endpoint_id, -1e9) < settings.ENGINE_SUSPECT_SECONDS:
        return
    _failure_reported_at[endpoint_id] = now
    _check_requests.submit(_enqueue_engine_checks, endpoint_id)


def _enqueue_engine_checks(endpoint_id: int) -> None:
    try:
        engines_check_after_failure(endpoint_id)
    except Exception:  # the beat's checks still come
        logger.warning(
            "cannot ask for a check of endpoint %s's engines", endpoint_id, exc_info=True
        )
    finally:
        connections.close_all()
