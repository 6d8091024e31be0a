from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from django.views.generic import TemplateView

from config import health

urlpatterns = [
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/kb/", include("knowledge.urls")),
    path("api/routing/", include("routing.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
]
