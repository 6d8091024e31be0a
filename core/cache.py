"""The Django cache's serializer: JSON instead of Django's pickle.

Django's RedisCache pickles values, so whoever can write one key to Redis (the broker's and the
Channels layer's store too) runs code in every web process that reads it. What the project
caches is plain data (the rules' version, counters), so JSON holds it.
"""

import json
import logging

logger = logging.getLogger(__name__)


class JSONSerializer:
    """Django's RedisSerializer contract: integers stay raw, so INCR and DECR work on them."""

    def dumps(self, obj):
        if type(obj) is int:
            return obj
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data):
        try:
            return int(data)
        except ValueError:
            pass
        try:
            return json.loads(data)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
            # Read as a miss, never executed: a pickle an earlier release cached (rewritten at its
            # next change), or a value someone wrote into Redis.
            logger.warning("a cached value is not JSON; read as missing")
            return None
