"""The HTTP server: vLLM's route table on aiohttp, and the process around it (the simulated
model load, the listening socket, shutdown on a signal)."""

import asyncio
import hashlib
import logging
import secrets
import signal
import sys

from aiohttp import web

from . import completions, info, lora_adapters, pooling
from .config import SimConfig
from .http_json import errors, json_response
from .state import SIM, Simulator

logger = logging.getLogger("inference_ops.simulator")


# vLLM's AuthenticationMiddleware guards these path prefixes only: /health, /metrics and
# /tokenize answer anyone, as they do there.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def _authenticate(keys: tuple[str, ...]):
    hashes = [hashlib.sha256(key.encode()).digest() for key in keys]

    @web.middleware
    async def authenticate(request: web.Request, handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIX):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            digest = hashlib.sha256(token.encode()).digest()
            matched = False
            for expected in hashes:  # every one compared, in constant time, as vLLM does
                matched |= secrets.compare_digest(digest, expected)
            if scheme.lower() != "bearer" or not matched:
                return json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return authenticate


def make_app(sim: Simulator) -> web.Application:
    # Without a key no middleware at all: the benchmarks' simulator pays nothing for it.
    keys = sim.config.api_keys
    app = web.Application(middlewares=[_authenticate(keys), errors] if keys else [errors])
    app[SIM] = sim
    app.router.add_get("/health", info.health)
    app.router.add_route("*", "/ping", info.health)  # SageMaker's probe, served by vLLM too
    app.router.add_get("/version", info.version)
    app.router.add_get("/v1/models", info.models)
    app.router.add_post("/tokenize", info.tokenize)
    # Like vLLM 0.32 (launchers/api_server/routers.py), a server has its runner's routes only: a
    # generative model no /v1/embeddings, a pooling model no generation; the other routes are
    # FastAPI's 404 {"detail": "Not Found"}.
    if not sim.config.pooling:
        app.router.add_post("/v1/chat/completions", completions.chat_completions)
        app.router.add_post("/v1/completions", completions.completions)
    if sim.config.embedding_dim:
        app.router.add_post("/v1/embeddings", pooling.embeddings)
    if sim.config.pooling:
        # An embedding model scores by the cosine of its vectors, a cross-encoder by its head.
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):  # one handler at all three
            app.router.add_post(path, pooling.rerank)
        for path in ("/score", "/v1/score"):
            app.router.add_post(path, pooling.score)
    app.router.add_get("/metrics", info.metrics_text)
    if sim.config.allow_runtime_lora_updating:
        # Like vLLM, the routes exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING set.
        logger.warning(
            "LoRA dynamic loading & unloading is enabled in the API server. "
            "This should ONLY be used for local development!"
        )
        app.router.add_post("/v1/load_lora_adapter", lora_adapters.load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", lora_adapters.unload_lora_adapter)
    return app


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
        make_app(sim),
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
