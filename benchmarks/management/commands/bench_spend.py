"""Spend limits, measured: what the check costs per request, and whether a limit holds across
processes.

    python manage.py bench_spend [--requests 5000] [--concurrency 64]
        [--processes 2] [--streams 64] [--bursts 3] [--max-tokens 48] [--share 4]
        [--prompts mixed|plain] [--engine simulator|vllm]

1. The check's cost, in this process against the real Redis: `--requests` answers reserved and
   settled, `--concurrency` at a time, as the pipeline does for each generated answer, against a
   key's, a user's and a group's limits at once (six counters: requests and tokens per minute,
   tokens per day, a budget). This process's CPU per request (both round trips, the scripts'
   arguments, the replies), Redis's own (INFO cpu; other clients of the same Redis show up in
   it), and the per-request cost when no limit applies (a dictionary lookup: no Redis at all).
2. Exactness: in `bench_spend_<database>`, the gateway under the production launcher with
   `--processes` daphne processes on the simulator, and `--bursts` bursts of `--streams`
   concurrent streams of one key, each burst in a fresh minute, against a tokens-per-minute limit
   that admits about 1/`--share` of the burst's reservations. Per burst: the tokens the answered
   streams used against the limit, and the overshoot, in tokens and in reservations (the issue's
   target: at most one). `--prompts mixed` (the default) asks a question of mixed scripts (digits,
   CJK, emoji, Cyrillic, Hangul, Devanagari beside Latin), what a token estimate undercounts
   most; `plain`, a short English one. The tokens used are what the engine counts: the real vLLM
   (`--engine vllm`, the bundled Gemma 3 270M; `manage.py vllm_engine_build` installs it) counts
   with Gemma 3's tokenizer, the simulator with a word tokenizer of its own, which counts a run of
   digits or CJK as one token: only the real engine's count tests the estimate.

Figures, not a test: the machine is shared, so quote medians of several runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
import uuid

import redis as redis_client
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import engine, spend
from benchmarks.engines import bundled_vllm_fields
from benchmarks.stack import StackError, stack_run, stack_session
from spend.policy import VERSION_KEY, Spec


class Command(BaseCommand):
    help = "Measure what the spend limits cost per request, and whether they hold across processes."

    def add_arguments(self, parser):
        parser.add_argument("--requests", type=int, default=5000)
        parser.add_argument("--concurrency", type=int, default=64)
        parser.add_argument("--processes", type=int, default=2, help="daphne processes")
        parser.add_argument("--streams", type=int, default=64, help="streams per burst")
        parser.add_argument("--bursts", type=int, default=3)
        parser.add_argument("--max-tokens", type=int, default=48)
        parser.add_argument(
            "--share", type=int, default=4, help="the limit admits 1/SHARE of a burst"
        )
        parser.add_argument("--skip-exactness", action="store_true")
        parser.add_argument("--prompts", choices=sorted(spend.PROMPTS), default="mixed")
        parser.add_argument("--engine", choices=("simulator", "vllm"), default="simulator")

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **o):
        # One line per request from the OpenAI SDK's HTTP client would bury the figures.
        for name in ("httpx", "httpx2"):  # the SDK's client, whichever transport it runs on
            logging.getLogger(name).setLevel(logging.WARNING)
        if min(o["requests"], o["concurrency"], o["processes"], o["streams"], o["bursts"]) < 1:
            raise CommandError("every count must be at least 1")
        self.check_cost(requests=o["requests"], concurrency=o["concurrency"])
        if o["skip_exactness"]:
            return
        name = f"bench_spend_{settings.DATABASES['default']['NAME']}"
        try:
            with stack_session(drop=name, say=self.out):
                self.exactness(name=name, **o)
        except StackError as exc:
            raise CommandError(str(exc)) from None

    def check_cost(self, *, requests: int, concurrency: int) -> None:
        roomy = 2_000_000_000
        run = f"bench{time.time_ns()}"  # counters of its own, gone with their windows
        specs = (
            Spec(
                kind="key",
                ident=run,
                label="API key bench",
                requests_per_minute=roomy,
                tokens_per_minute=roomy,
                tokens_per_day=roomy,
            ),
            Spec(
                kind="user",
                ident=run,
                label="user bench",
                tokens_per_minute=roomy,
                budget_micros=roomy * 1000,
            ),
            Spec(kind="group", ident=run, label="group bench", requests_per_minute=roomy),
        )
        cost = asyncio.run(
            spend.check_cost(
                specs=specs,
                requests=requests,
                concurrency=concurrency,
                redis_url=settings.REDIS_URL,
            )
        )
        self.out(
            f"check: {cost.requests} answers reserved and settled, {concurrency} at a time, "
            f"{cost.counters} counters each, in {cost.wall_s:.2f} s"
        )
        self.out(
            f"  this process: {cost.cpu_us:.0f} µs CPU per request (its reservation, from a "
            "lease or by a trip, and its share of the batched settlements)"
        )
        if cost.redis_us is not None:
            self.out(f"  Redis:        {cost.redis_us:.0f} µs CPU per request (INFO cpu)")
        if cost.calls is not None:
            self.out(
                f"  script calls: {cost.calls:.3f} per request (reservations and settlements; "
                "INFO commandstats)"
            )
        self.out(f"  no limit applying: {cost.lookup_us:.2f} µs per request (no Redis)")

    def exactness(self, *, name: str, **o) -> None:
        from django.contrib.auth import get_user_model

        from chat.apikeys import apikey_create
        from chat.models import ApiKey
        from spend.models import Limit

        sim_args = engine.simulator_args(max_num_seqs=512, ttft=20, itl=10)
        engine_fields = (
            bundled_vllm_fields(max_num_seqs=o["streams"] // o["share"] or 1)
            if o["engine"] == "vllm"
            else None
        )
        messages = spend.PROMPTS[o["prompts"]]
        self.out(
            f"exactness: {o['processes']} daphne processes, bursts of {o['streams']} streams, "
            f"max_tokens {o['max_tokens']}, {o['prompts']} prompts, on the {o['engine']}"
        )
        holder = {}

        def setup() -> None:
            user, _ = get_user_model().objects.get_or_create(username="bench-spend")
            ApiKey.objects.filter(user=user).delete()
            for label in ("probe", "burst"):
                raw = apikey_create(user=user, name=label, scopes=["chat"])[1]
                holder[label] = raw
                holder[f"{label}_id"] = ApiKey.objects.get(prefix=raw.split("_")[1])

        with stack_run(
            name=name,
            sim_args=sim_args,
            engine_fields=engine_fields,
            gateway_extra={"CHAT_RATE_LIMIT": "1000000", "CHAT_MAX_STREAMS_PER_USER": "1000000"},
            local_max_concurrency=o["streams"] * 2,
            web_concurrency=o["processes"],
            setup=lambda: (setup(), self._limits(holder, Limit, o)),
        ) as stack:
            url = stack.gateway.url
            rows = []
            for index in range(o["bursts"]):
                _fresh_minute()
                if index == 0:
                    reservation = spend.reservation_of(
                        url=url,
                        key=holder["probe"],
                        max_tokens=o["max_tokens"],
                        limit=10**9,
                        messages=messages,
                    )
                    limit = reservation * o["streams"] // o["share"]
                    self.out(
                        f"  one reservation: {reservation} tokens; limit: {limit} tokens per minute"
                    )
                    # The limit in force at the first burst: set before the gateway started
                    # with room for nothing, now given its value (every process rereads it).
                    Limit.objects.filter(api_key=holder["burst_id"]).update(tokens_per_minute=limit)
                    _publish(stack.redis_prefix)
                    time.sleep(2)  # each process rereads the limits within a second
                result = asyncio.run(
                    spend.burst(
                        url=url,
                        key=holder["burst"],
                        streams=o["streams"],
                        max_tokens=o["max_tokens"],
                        messages=messages,
                    )
                )
                over = result.spent - limit
                rows.append(over / reservation)
                used = max(result.answered, default=0)
                self.out(
                    f"  burst {index + 1}: {len(result.answered)} answered, {result.refused} "
                    f"refused; {result.spent} tokens used of {limit} "
                    f"(overshoot {over:+d} tokens, {over / reservation:+.2f} reservations); "
                    f"an answer used at most {used} tokens of its {reservation} reserved"
                )
            self.out(
                f"  overshoot, median of {len(rows)} bursts: {statistics.median(rows):+.2f} "
                f"reservations, worst {max(rows):+.2f} (target: at most +1)"
            )

    @staticmethod
    def _limits(holder: dict, limit_model, o) -> None:
        limit_model.objects.create(api_key=holder["probe_id"], tokens_per_minute=10**9)
        limit_model.objects.create(api_key=holder["burst_id"], tokens_per_minute=1)


def _fresh_minute() -> None:
    """Wait for the start of the next UTC minute (a burst in one window)."""
    time.sleep(60 - time.time() % 60 + 0.2)


def _publish(prefix: str) -> None:
    """Tell the gateway's processes that the limits changed, where they look: the stack gives the
    gateway a Redis key prefix of its own (this process's saves tell its own)."""
    client = redis_client.Redis.from_url(settings.REDIS_URL, socket_timeout=5)
    client.set(f"{prefix}:1:{VERSION_KEY}", json.dumps(uuid.uuid4().hex))
