class KnowledgeError(Exception):
    """Base of the knowledge layer's domain errors."""


class EmbeddingError(KnowledgeError):
    """The embedding backend failed or is misconfigured."""


class EntryInvalid(KnowledgeError):
    """An entry's fields do not pass validation; `errors` maps field to message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
