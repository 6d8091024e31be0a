from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
