# syntax=docker/dockerfile:1
# The gateway's one image. The web tier (python -m config.web), the Celery worker and beat, and the
# migrate step run it with different commands; vLLM runs from its own image, so this one needs no
# GPU (docker-compose.yml, deploy/k8s/).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A numeric user: Kubernetes can check runAsNonRoot only against a numeric one.
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /home/app --create-home --shell /usr/sbin/nologin app

WORKDIR /app

# requirements.txt pins torch==2.13.0, which the development machines install as the CPU build from
# their own disk. PyPI's torch wheel is the CUDA build, gigabytes of GPU libraries an embedding
# model on the CPU never loads; PyTorch's CPU index serves 2.13.0+cpu, which satisfies the pin and
# which pip prefers.
COPY requirements.txt .
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.txt

COPY . .

# A container listens on its own network namespace, so every address is the right one. The folders
# are the image's: the collected static files and the embedding model's exported graph are built
# below, once, instead of by every container at start.
ENV HOST=0.0.0.0 \
    STATIC_ROOT=/app/static \
    KB_EMBEDDING_CACHE_DIR=/app/cache/embeddings \
    VAR_DIR=/app/var \
    PROMETHEUS_MULTIPROC_DIR=/run/metrics

# With DEBUG off the settings need a secret key, a database and a Redis: these placeholders live in
# this one step only (not in the image's environment), and nothing connects to them.
RUN SECRET_KEY=image-build-placeholder \
    DATABASE_URL=postgresql://build@127.0.0.1:1/build \
    REDIS_URL=redis://127.0.0.1:1/0 \
    sh -c 'python manage.py collectstatic --noinput && python deploy/build_embedder.py' \
    && chown -R app:app /app/var /app/cache /run/metrics

USER 10001:10001
EXPOSE 8000

ENTRYPOINT ["sh", "/app/deploy/entrypoint.sh"]
CMD ["python", "-m", "config.web"]
