from django.apps import AppConfig


class SpendConfig(AppConfig):
    name = "spend"
    verbose_name = "spend: limits and budgets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from spend import signals

        signals.connect()
