"""The Content-Security-Policy header, on every response Django sends.

The policy is settings.SECURE_CSP: a dict of directive to sources, the shape Django 6.0's own
CSP support reads from the same setting, so moving to it is a change of MIDDLEWARE only.
Django 5.2 sends no such header; SecurityMiddleware already sends X-Content-Type-Options and
Referrer-Policy, XFrameOptionsMiddleware X-Frame-Options.

The policy is what stops an injected script even if one got into a page: `script-src 'self'`
runs only the site's own script files, never an inline script or an onclick= attribute, so no
template may hold one (tests/config/test_security_headers.py checks every page).
"""

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.utils.deprecation import MiddlewareMixin

HEADER = "Content-Security-Policy"


def policy_header(policy: dict[str, list[str]], *, host: str | None = None) -> str:
    """The header's value. With a host, connect-src also names that host's WebSocket URLs:
    CSP Level 3 lets 'self' match ws:/wss: of the page's own host, older browsers do not."""
    parts = []
    for directive, sources in policy.items():
        sources = list(sources)
        if directive == "connect-src" and host:
            sources += [f"ws://{host}", f"wss://{host}"]
        parts.append(" ".join([directive, *sources]))
    return "; ".join(parts)


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Sync and async capable (MiddlewareMixin): under ASGI it adds no thread hop to a request."""

    def __init__(self, get_response):
        super().__init__(get_response)
        self.policy = dict(settings.SECURE_CSP)
        self.debug = settings.DEBUG

    def process_response(self, request, response):
        # With DEBUG on, an error is Django's technical page, made of inline scripts and styles the
        # policy would refuse (its tracebacks would not unfold). DEBUG is never on in production.
        if self.debug and response.status_code >= 400:
            return response
        if HEADER not in response:
            try:
                host = request.get_host()
            except DisallowedHost:  # the 400 for a host we do not serve: no host to name
                host = None
            response[HEADER] = policy_header(self.policy, host=host)
        return response
