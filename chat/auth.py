"""API-key authentication (Bearer) and scope checks for the DRF API."""

from rest_framework import authentication, exceptions, permissions

from chat.apikeys import apikey_authenticate
from chat.models import ApiKey


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer gw_…`. request.auth is the ApiKey."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            return None
        key = apikey_authenticate(raw=raw.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        return key.user, key

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class HasScope(permissions.BasePermission):
    """A session user passes; an API key needs `scope`."""

    scope = ApiKey.Scope.CHAT

    def has_permission(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return False
        key = request.auth if isinstance(request.auth, ApiKey) else None
        return key is None or self.scope in key.scopes


class ChatScope(HasScope):
    scope = ApiKey.Scope.CHAT


class SessionOnly(permissions.BasePermission):
    """Key management needs a logged-in browser session: a key cannot mint keys."""

    def has_permission(self, request, view):
        return bool(
            request.user and request.user.is_authenticated and not isinstance(request.auth, ApiKey)
        )
