"""Sign-in, sessions and the security headers: password rules, the login throttle, HTTPS,
cookies, the Content-Security-Policy."""

from config.settings.base import DEBUG
from core.env import env_bool, env_int, env_url

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat"
LOGOUT_REDIRECT_URL = "login"
# Failed sign-ins (chat and admin logins together) per window, counted in Redis; at the limit even
# the right password waits for the window's end (core.login_throttle).
LOGIN_FAILURES_PER_USERNAME = env_int("LOGIN_FAILURES_PER_USERNAME", 5, minimum=1)
# Higher than the username's: many people may sign in through one office's or one carrier's address.
LOGIN_FAILURES_PER_ADDRESS = env_int("LOGIN_FAILURES_PER_ADDRESS", 50, minimum=1)
LOGIN_FAILURE_WINDOW = env_int(
    "LOGIN_FAILURE_WINDOW", 900, minimum=1
)  # seconds, from the first failure

SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("TRUST_X_FORWARDED_PROTO", False) else None
)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# Health probes come from the load balancer over plain HTTP inside the network; a Prometheus
# scraper reaches each host directly, as the probes do, not through the TLS proxy in front.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 14 * 24 * 3600, minimum=60)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Sent on every response by config.csp (the shape of Django 6.0's own setting). The pages run
# only the site's script files: no inline script or handler, no inline style, nothing from
# another origin. img-src allows data: for the empty favicon and Swagger UI's icons.
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],  # config.csp adds the page's own ws:// and wss:// host
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
}
_csp_report_uri = env_url("CSP_REPORT_URI", schemes=("http", "https"), default="")
if _csp_report_uri:
    SECURE_CSP["report-uri"] = [_csp_report_uri]
