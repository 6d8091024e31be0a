"""The Django cache (Redis) stores JSON, never pickles: who can write a key to Redis must not
run code in the web process by it."""

import os
import pickle

import pytest
from django.conf import settings
from django.core.cache import caches

from core import redis as core_redis


class _RunsCode:
    """A pickle that would create a file when loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def cache():
    cache = caches["default"]
    yield cache
    cache.delete_many(["poisoned", "values", "counter"])


def test_a_pickle_written_into_redis_is_not_loaded(cache, tmp_path):
    marker = tmp_path / "ran"
    core_redis.client().set(
        cache.make_and_validate_key("poisoned"), pickle.dumps(_RunsCode(str(marker)))
    )

    assert cache.get("poisoned") is None  # read as missing
    assert not os.path.exists(marker)


def test_what_the_project_caches_comes_back_as_it_went_in(cache):
    value = {"version": "3f2a", "rules": [1, 2.5, "x", None, True], "nested": {"ok": False}}
    cache.set("values", value)
    assert cache.get("values") == value
    cache.set("counter", 1)
    assert cache.incr("counter") == 2 and cache.get("counter") == 2


def test_the_settings_name_the_json_serializer():
    assert settings.CACHES["default"]["OPTIONS"]["serializer"] == "core.cache.JSONSerializer"
