from core.errors import DomainError


class KnowledgeError(DomainError):
    """Base of the knowledge layer's domain errors."""


class EmbeddingError(KnowledgeError):
    """The embedding backend failed or is misconfigured."""

    status = 503
    code = "embedding_unavailable"


class EntryInvalid(KnowledgeError):
    """An entry's fields do not pass validation; `errors` maps field to message."""

    code = "invalid_entry"

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(fields=errors)
