from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from chat.api import keys as chat_keys
from chat.api import usage as chat_usage
from config import health, metrics
from core.login_throttle import AdminLoginForm, refused_with_429

# The admin's sign-in counts failures with the chat's (core.login_throttle); its own URL comes
# first so a throttled attempt answers 429.
admin.site.login_form = AdminLoginForm

urlpatterns = [
    path("", include("chat.page_urls")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("admin/login/", refused_with_429(admin.site.login)),
    path("admin/", admin.site.urls),
    path("api/kb/", include("knowledge.urls")),
    path("api/routing/", include("routing.urls")),
    path("api/chat/", include("chat.urls")),
    path("api/keys/", chat_keys.ApiKeyListView.as_view(), name="api-keys"),
    path("api/usage", chat_usage.UsageView.as_view(), name="api-usage"),
    path("api/keys/<int:pk>/", chat_keys.ApiKeyDetailView.as_view(), name="api-key"),
    # The schema and its page are public: they read no credentials (a bad key there would
    # otherwise fail inside the page's template, a 500).
    path("api/schema/", SpectacularAPIView.as_view(authentication_classes=[]), name="api-schema"),
    # The split view serves the page's script from ?script, not inline: the CSP allows no inline
    # script.
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api-schema", authentication_classes=[]),
        name="api-docs",
    ),
]

handler500 = "core.errors.server_error"
