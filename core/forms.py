"""Form fields shared by the apps' admin pages."""

from django import forms


class LinesField(forms.CharField):
    """A list of strings edited as one item per line."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value):
        return "\n".join(value) if isinstance(value, list) else value

    def to_python(self, value):
        return [line.strip() for line in (value or "").splitlines() if line.strip()]
