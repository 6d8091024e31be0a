"""The HTTP side: vLLM's routes on aiohttp, the process lifecycle, fault injection."""

import asyncio
import json
import logging
import random
import signal
import sys
import time
import uuid

from aiohttp import web

from . import embeddings as sim_embeddings
from . import scoring
from .config import FAULTS, LoraModule, SimConfig
from .engine import Engine, Sequence
from .generation import plan_output
from .metrics import Metrics
from .protocol import (
    ENGINE_ERROR_MESSAGE,
    APIError,
    ChunkWriter,
    context_length_error,
    dumps,
    error_body,
    full_response,
    pair_length_error,
    parse_chat,
    parse_completion,
    parse_rerank,
    parse_score,
    rerank_response,
    score_pairs,
    score_response,
    validation_error,
)
from .tokenizer import chat_prompt_tokens, token_ids, tokenize

logger = logging.getLogger("inference_ops.simulator")
access_logger = logging.getLogger("aiohttp.access")

VERSION = "0.11.0+sim"  # the vLLM version whose API this simulates, marked as a simulator
FAULT_HEADER = "X-Sim-Fail"
HANG_SECONDS = 3600.0  # a hung request is released by the client giving up, or after this
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}


class Simulator:
    def __init__(self, config: SimConfig):
        self.config = config
        self.created = int(time.time())
        self.served_names = config.served_model_names or (config.model,)
        self.metrics = Metrics(config.primary_name)
        self.engine = Engine(
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            ttft=config.ttft,
            itl=config.itl,
            metrics=self.metrics,
            max_loras=config.max_loras if config.enable_lora else None,
            block_size=config.block_size,
            prefix_caching=config.enable_prefix_caching,
        )
        self.loras: dict[str, LoraModule] = {m.name: m for m in config.lora_modules}
        # Two streams from one seed, so injected faults do not shift generated text.
        self._text_rng = random.Random(config.seed)
        self._fault_rng = random.Random(None if config.seed is None else config.seed + 1)
        self.app = self._make_app()

    def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[_errors])
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/ping", self.health)  # SageMaker's probe, served by vLLM too
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/embeddings", self.embeddings)
        for path in (
            "/rerank",
            "/v1/rerank",
            "/v2/rerank",
        ):  # vLLM serves the one handler at all three
            app.router.add_post(path, self.rerank)
        for path in ("/score", "/v1/score"):
            app.router.add_post(path, self.score)
        app.router.add_get("/metrics", self.metrics_text)
        if self.config.allow_runtime_lora_updating:
            # Like vLLM, the routes exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING set.
            logger.warning(
                "LoRA dynamic loading & unloading is enabled in the API server. "
                "This should ONLY be used for local development!"
            )
            app.router.add_post("/v1/load_lora_adapter", self.load_lora_adapter)
            app.router.add_post("/v1/unload_lora_adapter", self.unload_lora_adapter)
        return app

    # -- small routes ---------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return _json_response({"version": VERSION})

    async def models(self, request: web.Request) -> web.Response:
        cards = [
            self._model_card(name, root=self.config.model, parent=None)
            for name in self.served_names
        ]
        for lora in self.loras.values():
            parent = (
                lora.base_model_name
                if lora.base_model_name in self.served_names
                else self.served_names[0]
            )
            cards.append(self._model_card(lora.name, root=lora.path, parent=parent))
        return _json_response({"object": "list", "data": cards})

    def _model_card(self, name: str, *, root: str, parent: str | None) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            # vLLM only states the context window on base models.
            "max_model_len": self.config.max_model_len if parent is None else None,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    async def metrics_text(self, request: web.Request) -> web.Response:
        body = self.metrics.render(self.engine.state()).encode()
        return web.Response(
            body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        body = _json_body(request, await request.read())
        if not isinstance(body, dict):
            raise validation_error("body", "Input should be a valid dictionary", "dict_type")
        self._resolve_model(body.get("model"))
        if isinstance(body.get("messages"), list):
            tokens = chat_prompt_tokens(body["messages"])
            if body.get("add_generation_prompt") is False:
                tokens = tokens[:-3]  # the trailing "<|im_start|>assistant\n"
        elif isinstance(body.get("prompt"), str):
            tokens = tokenize(body["prompt"])
        else:
            raise validation_error("prompt", "Field required", "missing")
        return _json_response(
            {
                "count": len(tokens),
                "max_model_len": self.config.max_model_len,
                "tokens": token_ids(tokens),
                "token_strs": tokens if body.get("return_token_strs") else None,
            }
        )

    # -- LoRA adapters at runtime ------------------------------------------------------

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        body = _json_body(request, await request.read())
        body = body if isinstance(body, dict) else {}
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            raise APIError(
                "Both 'lora_name' and 'lora_path' must be provided.", err_type="InvalidUserInput"
            )
        if name in self.loras and not body.get("load_inplace"):
            raise APIError(
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                err_type="InvalidUserInput",
            )
        if not self.config.enable_lora:
            # vLLM passes the adapter to an engine that has no LoRA support: a 500.
            raise APIError(
                "LoRA is not enabled. Use --enable-lora to enable LoRA.",
                err_type="InternalServerError",
                status=500,
            )
        self.loras[name] = LoraModule(name=name, path=path)
        logger.info("Loaded new LoRA adapter: name '%s', path '%s'", name, path)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        body = _json_body(request, await request.read())
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not name:
            raise APIError(
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                err_type="InvalidUserInput",
            )
        if name not in self.loras:
            raise APIError(
                f"The lora adapter '{name}' cannot be found.", err_type="NotFoundError", status=404
            )
        del self.loras[name]
        logger.info("Removed LoRA adapter: name '%s'", name)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    # -- generation ------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_chat)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_completion)

    async def _generate(self, request: web.Request, parse) -> web.StreamResponse:
        raw = await request.read()  # read first, so a dropped connection closes cleanly
        fault = self._pick_fault(request)
        if (refused := await self._early_fault(request, fault)) is not None:
            return refused

        params = parse(_json_body(request, raw))
        if self.config.cross_encoder:
            api = "Chat Completions" if params.endpoint == "chat" else "Completions"
            raise APIError(f"The model does not support {api} API")
        model, seq = self._new_sequence(params)
        if fault == "before-first-token":
            # The engine dies during prefill: a stream has its 200 and headers, then nothing.
            if params.stream:
                await web.StreamResponse(headers=SSE_HEADERS).prepare(request)
            await asyncio.sleep(self.config.ttft / 2)
            await _drop_connection(request)
        # Where a mid-stream fault strikes: after a few tokens, always before the end.
        fail_after = max(1, min(3, len(seq.output.tokens) - 1)) if fault == "mid-stream" else None
        if params.stream:
            return await self._stream(request, params, model, seq, fail_after)
        return await self._complete(params, model, seq, fail_after)

    async def _early_fault(self, request: web.Request, fault: str | None) -> web.Response | None:
        """The faults that strike before the request is handled: the connection dropped, a hang,
        a 500 (raised), or a 429 (returned, for the handler to send)."""
        if fault == "connect-close":
            await _drop_connection(request)
        if fault == "hang":
            await asyncio.sleep(HANG_SECONDS)
            await _drop_connection(request)
        if fault == "500":
            raise APIError(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
        if fault == "429":
            body = error_body(
                "The server is overloaded, retry later.", err_type="RateLimitError", status=429
            )
            return _json_response(body, status=429, headers={"Retry-After": "1"})
        return None

    def _new_sequence(self, params) -> tuple[str, Sequence]:
        """Validate a parsed request against the served models and plan its output."""
        model, lora = self._resolve_model(params.model)
        prompt_len = len(params.prompt_tokens)
        error = context_length_error(
            max_model_len=self.config.max_model_len,
            prompt_tokens=prompt_len,
            max_tokens=params.max_tokens,
        )
        if error is not None:
            raise error
        rng = random.Random(
            params.seed if params.seed is not None else self._text_rng.getrandbits(64)
        )
        output = plan_output(
            mode=self.config.mode,
            rng=rng,
            echo_text=params.echo_text,
            max_tokens=params.max_tokens,
            room=self.config.max_model_len - prompt_len,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        return model, Sequence(
            request_id=uuid.uuid4().hex,
            prompt_ids=token_ids(params.prompt_tokens),
            output=output,
            lora=lora,
        )

    async def _stream(
        self, request, params, model: str, seq: Sequence, fail_after: int | None
    ) -> web.StreamResponse:
        writer = ChunkWriter(endpoint=params.endpoint, model=model)
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        self.engine.submit(seq)
        sent = 0
        try:
            async for batch in seq.stream():
                if sent == 0 and params.endpoint == "chat":
                    await response.write(writer.role())
                if fail_after is not None and sent + len(batch) >= fail_after:
                    text = "".join(batch[: fail_after - sent])
                    if text:
                        await response.write(writer.delta(text))
                    self.engine.abort(seq)
                    # vLLM reports an engine failure inside the stream as an error
                    # event, then still ends the stream with [DONE].
                    await response.write(writer.error())
                    await response.write(writer.DONE)
                    return response
                sent += len(batch)
                text = "".join(batch)
                if seq.finished and not seq.aborted and sent == seq.generated:
                    await response.write(
                        writer.delta(text, seq.finish_reason, seq.output.stop_reason)
                    )
                elif text:
                    await response.write(writer.delta(text))
            if params.include_usage:
                await response.write(writer.usage(seq.prompt_tokens, seq.generated))
            await response.write(writer.DONE)
        except ConnectionResetError:
            # The client left between two writes; the finally frees its slot.
            pass
        finally:
            self.engine.abort(seq)  # a no-op when the sequence finished
        return response

    async def _complete(
        self, params, model: str, seq: Sequence, fail_after: int | None
    ) -> web.Response:
        self.engine.submit(seq)
        try:
            if fail_after is not None:
                async for _ in seq.stream():
                    if seq.generated >= fail_after:
                        break
                self.engine.abort(seq)
                raise APIError(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
            await seq.wait_finished()
        finally:
            self.engine.abort(seq)
        return _json_response(
            full_response(
                endpoint=params.endpoint,
                model=model,
                text=seq.output.text,
                finish_reason=seq.output.finish_reason,
                stop_reason=seq.output.stop_reason,
                prompt_tokens=seq.prompt_tokens,
                completion_tokens=seq.generated,
            )
        )

    async def embeddings(self, request: web.Request) -> web.Response:
        body = _json_body(request, await request.read())
        if not isinstance(body, dict):
            raise validation_error("body", "Input should be a valid dictionary", "dict_type")
        model, _ = self._resolve_model(body.get("model"), pooling=True)
        if not self.config.embedding_dim:
            raise APIError("The model does not support Embeddings API", param="model")
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise validation_error(
                "input", "Input should be a string or a list of strings", "string_type"
            )
        encoding_format = body.get("encoding_format") or "float"
        if encoding_format not in ("float", "base64"):
            raise validation_error(
                "encoding_format", "Input should be 'float' or 'base64'", "literal_error"
            )
        prompt_tokens = 0
        data = []
        for index, text in enumerate(texts):
            tokens = tokenize(text)
            if len(tokens) > self.config.max_model_len:
                raise APIError(
                    "This model's maximum context length is "
                    f"{self.config.max_model_len} tokens. However, you requested {len(tokens)} "
                    "tokens in the input for embedding generation. Please reduce the length of "
                    "the input.",
                    param="input",
                )
            prompt_tokens += len(tokens)
            vector = sim_embeddings.embed(text, self.config.embedding_dim)
            data.append(
                {
                    "index": index,
                    "object": "embedding",
                    "embedding": sim_embeddings.encode(vector, encoding_format),
                }
            )
        return _json_response(
            {
                "id": f"embd-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": model,
                "data": data,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens,
                    "completion_tokens": 0,
                },
            }
        )

    # -- rerank and score --------------------------------------------------------------

    async def rerank(self, request: web.Request) -> web.Response:
        return await self._score(request, parse_rerank)

    async def score(self, request: web.Request) -> web.Response:
        return await self._score(request, parse_score)

    async def _score(self, request: web.Request, parse) -> web.Response:
        """/rerank and /score: every pair in one forward pass, which takes --time-to-first-token
        (a pooling model only prefills). The faults of a request apply as to a generation that
        is not streamed: a drop or a 500 during the pass."""
        raw = await request.read()
        fault = self._pick_fault(request)
        if (refused := await self._early_fault(request, fault)) is not None:
            return refused
        params = parse(_json_body(request, raw))
        if not (self.config.cross_encoder or self.config.embedding_dim):
            api = "Rerank (Score)" if params.endpoint == "rerank" else "Score"
            raise APIError(f"The model does not support {api} API")
        model, _ = self._resolve_model(params.model, pooling=True)
        pairs = score_pairs(params)
        tokens = 0
        for one, two in pairs:
            count = len(tokenize(one)) + len(tokenize(two)) + scoring.PAIR_SPECIAL_TOKENS
            error = pair_length_error(
                max_model_len=self.config.max_model_len, tokens=count, endpoint=params.endpoint
            )
            if error is not None:
                raise error
            tokens += count
        if fault == "before-first-token":
            await asyncio.sleep(self.config.ttft / 2)
            await _drop_connection(request)
        await asyncio.sleep(self.config.ttft)
        if fault == "mid-stream":
            raise APIError(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
        if self.config.cross_encoder:
            scores = [scoring.cross_encoder_score(one, two) for one, two in pairs]
        else:
            # An embedding model scores a pair by the cosine of its two vectors, as vLLM does.
            scores = [
                scoring.embedding_score(one, two, self.config.embedding_dim) for one, two in pairs
            ]
        if params.endpoint == "rerank":
            body = rerank_response(
                model=model,
                documents=params.texts_2,
                scores=scores,
                top_n=params.top_n,
                tokens=tokens,
            )
        else:
            body = score_response(model=model, scores=scores, tokens=tokens)
        return _json_response(body)

    def _resolve_model(self, name: str | None, *, pooling: bool = False) -> tuple[str, str | None]:
        """The model name to answer with, and the LoRA adapter to use."""
        if not name or name in self.served_names:
            # vLLM answers with the primary served name, whichever alias was asked for; a request
            # that names no model at all goes to the base model.
            return self.served_names[0], None
        if name in self.loras:
            return name, name
        message = f"The model `{name}` does not exist."
        if not pooling:
            # vLLM's check for generation and /tokenize names the base model's served names (never
            # the adapters); its pooling routes (embeddings, rerank, score) fail later, without
            # them.
            message += f" Valid aliases: {', '.join(self.served_names)}."
        raise APIError(message, err_type="NotFoundError", status=404, param="model")

    def _pick_fault(self, request: web.Request) -> str | None:
        header = request.headers.get(FAULT_HEADER)
        if header:
            fault = header.strip().lower()
            if fault not in FAULTS:
                raise APIError(
                    f"Unknown {FAULT_HEADER} value {header!r}; "
                    f"expected one of: {', '.join(FAULTS)}."
                )
        elif (
            self.config.failure_injection_rate
            and self._fault_rng.random() < self.config.failure_injection_rate
        ):
            fault = self._fault_rng.choice(FAULTS)
        else:
            return None
        logger.info("injecting fault %s into %s %s", fault, request.method, request.path)
        return fault


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as exc:
        return _json_response(exc.body(), status=exc.status)
    except web.HTTPNotFound:
        # FastAPI's body for an unknown route, which is what clients of vLLM see.
        return _json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return _json_response({"detail": "Method Not Allowed"}, status=405)
    except asyncio.CancelledError:
        # aiohttp writes no access line for a handler cut short; say what happened.
        access_logger.info(
            '%s "%s %s" connection closed before the response ended',
            request.remote,
            request.method,
            request.path,
        )
        raise


def _json_response(body, *, status: int = 200, headers=None) -> web.Response:
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


def _json_body(request: web.Request, raw: bytes):
    # vLLM's validate_json_request: anything but application/json is a 400.
    if request.content_type != "application/json":
        raise APIError("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        return json.loads(raw)
    except ValueError:
        raise validation_error("body", "JSON decode error", "json_invalid") from None


async def _drop_connection(request: web.Request):
    """Close the TCP connection with no (further) HTTP response."""
    transport = request.transport
    if transport is not None:
        transport.close()
    # aiohttp cancels this handler once it notices the connection is gone
    # (handler_cancellation=True); nothing is ever written.
    await asyncio.sleep(HANG_SECONDS)
    raise ConnectionResetError("connection dropped by fault injection")


# -- process lifecycle ------------------------------------------------------------------


def run(config: SimConfig) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(levelname)s %(asctime)s [%(name)s] %(message)s",
    )
    return asyncio.run(_serve(config))


async def _serve(config: SimConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if config.ignored_args:
        logger.info(
            "ignoring vLLM arguments the simulator does not model: %s",
            " ".join(config.ignored_args),
        )

    # Like vLLM loading weights: the port is not even bound until startup ends,
    # so a prober gets "connection refused", not an error status.
    logger.info("loading model %s (simulated startup %.1fs)", config.model, config.startup_duration)
    if config.startup_duration > 0:
        try:
            await asyncio.wait_for(stop.wait(), config.startup_duration)
            return 0  # stopped while loading
        except TimeoutError:
            pass

    sim = Simulator(config)
    engine_task = sim.engine.start()
    engine_task.add_done_callback(lambda _task: stop.set())
    runner = web.AppRunner(
        sim.app,
        handler_cancellation=True,  # a client that disconnects must free its engine slot at once
        access_log_format='%a "%r" %s %Tfs',
        shutdown_timeout=1.0,
    )
    await runner.setup()
    # A deep backlog: hundreds of clients connecting at once must not hit SYN retries.
    site = web.TCPSite(runner, config.host, config.port, backlog=2048, reuse_address=True)
    await site.start()
    host, port = runner.addresses[0][:2]
    logger.info(
        "simulator ready on %s:%d model=%s served=%s loras=%s",
        host,
        port,
        config.model,
        ",".join(sim.served_names),
        ",".join(sim.loras) or "-",
    )
    await stop.wait()

    logger.info("shutting down")
    await runner.cleanup()
    if engine_task.done() and not engine_task.cancelled() and engine_task.exception() is not None:
        logger.error("engine loop died", exc_info=engine_task.exception())
        return 1
    await sim.engine.stop()
    return 0
