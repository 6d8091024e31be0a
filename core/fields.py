"""DRF fields shared by the apps' APIs."""

from rest_framework import serializers

from core.text import validate_text


class TextField(serializers.CharField):
    """A CharField that refuses numbers, booleans and lists instead of turning them into text, and
    text that cannot be stored or sent to a model (core.text)."""

    def __init__(self, **kwargs):
        kwargs["validators"] = [validate_text, *kwargs.get("validators", ())]
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)
