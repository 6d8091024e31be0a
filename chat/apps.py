from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"

    def ready(self):
        from chat import schema  # noqa: F401 - registers the OpenAPI description of API keys
