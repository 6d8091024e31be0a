from django.apps import AppConfig


class InferenceOpsConfig(AppConfig):
    name = "inference_ops"
    verbose_name = "Inference operations"
