"""The continuous-batching scheduler.

One asyncio task plays vLLM's engine loop. Every step (one --inter-token-latency)
each running sequence gets its next token, however many are running: that is
why two concurrent requests finish in about the time of one. At most
--max-num-seqs sequences run; the rest wait in FIFO order for a slot, which
frees the moment a sequence finishes or is aborted (by each request's `priority`,
lower first, under --scheduling-policy priority, as vLLM's priority queue; vLLM
takes a priority under either policy, so the simulator does too).

A newly admitted sequence gets its first token --time-to-first-token after
admission, on the step closest to that moment: steps keep their rhythm for the
sequences already decoding, so the first token lands within half a step of the
configured value. When nothing is decoding the loop jumps straight to the
first-token time, so a lone request sees the configured TTFT exactly.

The loop wakes each sequence through an asyncio.Event; there is no timer per
token or per request, which is what lets one process carry hundreds of streams.

Admission is where vLLM's scheduler looks a prompt up in the prefix cache
(prefix_cache.py), so the prefix-cache counters move there, and the prompt's
blocks count as computed from then on, as vLLM marks them when it schedules
them.
"""

import asyncio
import collections
import logging
import math
from collections.abc import AsyncIterator

from .generation import PlannedOutput
from .metrics import EngineState, Metrics
from .prefix_cache import PrefixCache
from .tokenizer import token_ids

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 16  # tokens per KV-cache block, vLLM's default on GPU


class Sequence:
    """One request inside the engine, and the channel its tokens come out of."""

    def __init__(
        self,
        *,
        request_id: str,
        prompt_ids: list[int],
        output: PlannedOutput,
        lora: str | None = None,
        wake: asyncio.Event | None = None,
        priority: int = 0,
    ):
        self.request_id = request_id
        self.priority = priority  # lower runs first under the priority policy
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.output = output
        self.lora = lora
        self.generated = 0  # tokens produced so far
        self.finish_reason: str | None = None  # "stop", "length" or "abort" once finished
        self.arrival = 0.0
        self.first_token_due = 0.0
        self.last_token_at = 0.0
        self.cached_tokens = 0  # prompt tokens found in the prefix cache at admission
        self.cache_created_tokens = 0  # prompt tokens of full blocks it added to the cache
        self._read = 0
        # The n sequences of one request share one event, so their reader wakes for any of them.
        self._event = wake if wake is not None else asyncio.Event()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"

    def take(self) -> tuple[int, int] | None:
        """The tokens produced since the last take, as a [start, end) range, or None."""
        if self._read < self.generated:
            start, self._read = self._read, self.generated
            return start, self.generated
        return None

    @property
    def ended(self) -> bool:
        """Finished, and every token taken."""
        return self.finished and self._read >= self.generated

    async def stream(self) -> AsyncIterator[list[str]]:
        """Yield the text of new tokens as they come.

        When the reader falls behind, the tokens produced meanwhile come as one
        batch, as vLLM merges outputs for a slow client.
        """
        while True:
            span = self.take()
            if span is not None:
                yield self.output.tokens[span[0] : span[1]]
            elif self.finished:
                return
            else:
                self._event.clear()
                await self._event.wait()

    async def wait_finished(self) -> None:
        while not self.finished:
            self._event.clear()
            await self._event.wait()


async def merged(seqs: list[Sequence]) -> AsyncIterator[tuple[int, int, int]]:
    """(sequence index, start, end) for the new tokens of sequences that share a wake event, in
    the order the engine's steps produce them: the n choices of one request, interleaved."""
    wake = seqs[0]._event
    while True:
        wake.clear()  # before looking: a step during a yield below is seen on the next pass
        progressed = False
        for index, seq in enumerate(seqs):
            span = seq.take()
            if span is not None:
                progressed = True
                yield index, span[0], span[1]
        if all(seq.ended for seq in seqs):
            return
        if not progressed:
            await wake.wait()


class Engine:
    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_model_len: int,
        ttft: float,
        itl: float,
        metrics: Metrics,
        max_loras: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        prefix_caching: bool = True,
        priority_scheduling: bool = False,
    ):
        self.max_num_seqs = max_num_seqs
        self.priority_scheduling = priority_scheduling
        self.max_model_len = max_model_len
        self.ttft = ttft
        self.itl = itl
        self.metrics = metrics
        self.max_loras = max_loras
        self.block_size = block_size
        self.prefix_cache = PrefixCache(block_size=block_size) if prefix_caching else None
        self.running: dict[Sequence, None] = {}  # a dict keeps admission order and removes in O(1)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> asyncio.Task:
        self._task = asyncio.create_task(self._run(), name="sim-engine")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def submit(self, seq: Sequence) -> None:
        now = asyncio.get_running_loop().time()
        seq.arrival = now
        if len(self.running) < self.max_num_seqs:
            self._admit(seq, now)
        elif self.priority_scheduling:
            # vLLM's priority queue: by (priority, arrival); equal priorities keep their order.
            at = len(self.waiting)
            while at and self.waiting[at - 1].priority > seq.priority:
                at -= 1
            self.waiting.insert(at, seq)
        else:
            self.waiting.append(seq)
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence at once (client gone, or a fault): its slot frees now."""
        if seq.finished:
            return
        now = asyncio.get_running_loop().time()
        if seq in self.running:
            del self.running[seq]
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self._finish(seq, "abort", now)
        self._fill_slots(now)

    def state(self) -> EngineState:
        blocks = sum(
            math.ceil((seq.prompt_tokens + seq.generated) / self.block_size) for seq in self.running
        )
        capacity_blocks = self.max_num_seqs * math.ceil(self.max_model_len / self.block_size)
        return EngineState(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_cache_usage=min(1.0, blocks / capacity_blocks),
            max_loras=self.max_loras,
            running_loras=tuple(sorted({s.lora for s in self.running if s.lora})),
            waiting_loras=tuple(sorted({s.lora for s in self.waiting if s.lora})),
        )

    # -- the loop ---------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_step: float | None = None
        while True:
            if not self.running:
                next_step = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            if not any(seq.generated for seq in self.running):
                # Nothing decoding: no rhythm to keep, go straight to the first prefill.
                next_step = max(now, min(seq.first_token_due for seq in self.running))
            assert next_step is not None
            # Sleep even when late (delay 0): the handlers must get to write.
            await asyncio.sleep(max(0.0, next_step - now))
            now = loop.time()
            self._step(next_step, now)
            next_step += self.itl
            if next_step < now - self.itl:
                # Over a step behind (an overloaded CPU): steps just take longer, as
                # on a saturated GPU; no burst of catch-up steps.
                next_step = now

    def _step(self, step_time: float, now: float) -> None:
        metrics = self.metrics
        half_step = self.itl / 2
        for seq in list(self.running):
            if seq.generated == 0:
                if step_time < seq.first_token_due - half_step:
                    continue  # still in prefill
                metrics.prompt_tokens += seq.prompt_tokens
                metrics.ttft.observe(now - seq.arrival)
            else:
                metrics.inter_token.observe(now - seq.last_token_at)
            seq.generated += 1
            seq.last_token_at = now
            metrics.generation_tokens += 1
            seq._event.set()
            if seq.generated >= len(seq.output.tokens):
                del self.running[seq]
                self._finish(seq, seq.output.finish_reason, now)
        self._fill_slots(now)

    def _admit(self, seq: Sequence, now: float) -> None:
        self.running[seq] = None
        seq.first_token_due = now + self.ttft
        self.metrics.queue_time.observe(now - seq.arrival)
        if self.prefix_cache is not None:
            # With prefix caching off vLLM records no lookup at all: both counters stay at 0.
            hits = self.prefix_cache.hit_tokens(seq.prompt_ids, seq.lora)
            self.metrics.prefix_cache_queries += seq.prompt_tokens
            self.metrics.prefix_cache_hits += hits
            self.prefix_cache.store(seq.prompt_ids, seq.lora)
            # vLLM's prefill stats: what the cache had, and what this prompt's full blocks add.
            seq.cached_tokens = hits
            full_blocks = seq.prompt_tokens // self.block_size * self.block_size
            seq.cache_created_tokens = max(0, full_blocks - hits)

    def _fill_slots(self, now: float) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self._admit(self.waiting.popleft(), now)
        if self.running:
            self._wake.set()

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        if self.prefix_cache is not None and seq.generated > 1:
            # The output's blocks stay cached too, so the next turn of a chat, which repeats this
            # answer, hits them. The last token sampled was never fed back: it has no KV.
            generated_ids = token_ids(seq.output.tokens[: seq.generated - 1])
            self.prefix_cache.store(seq.prompt_ids + generated_ids, seq.lora)
        seq.finish_reason = reason
        self.metrics.request_success[reason] += 1
        if reason != "abort":
            self.metrics.e2e.observe(now - seq.arrival)
        seq._event.set()
