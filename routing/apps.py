from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"

    def ready(self):
        from routing import breaker, signals

        signals.connect()
        breaker.connect()
