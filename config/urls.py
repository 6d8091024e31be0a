from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from chat import api as chat_api
from config import health

urlpatterns = [
    path("", include("chat.page_urls")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/kb/", include("knowledge.urls")),
    path("api/routing/", include("routing.urls")),
    path("api/chat/", include("chat.urls")),
    path("api/keys/", chat_api.ApiKeyListView.as_view(), name="api-keys"),
    path("api/keys/<int:pk>/", chat_api.ApiKeyDetailView.as_view(), name="api-key"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
