"""The admin's field for a list of personal data types: a checkbox a type (privacy.detector.TYPES),
as the endpoints' policy, the rules' condition and the privacy settings ask for them."""

from django import forms
from django.db import models

from privacy.detector import TYPES


def types_field(label: str, model: type[models.Model], name: str) -> forms.Field:
    """The form field for `model`'s field `name` (an ArrayField of types), with its help text."""
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)  # a column, not a relation
    return forms.TypedMultipleChoiceField(
        choices=[(kind, kind) for kind in TYPES],
        widget=forms.CheckboxSelectMultiple,
        required=False,
        label=label,
        help_text=field.help_text,
    )
