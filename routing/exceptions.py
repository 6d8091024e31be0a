from core.errors import DomainError


class RoutingError(DomainError):
    """Base of the routing layer's domain errors."""


class RuleInvalid(RoutingError):
    code = "invalid_rule"

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(fields=errors)
