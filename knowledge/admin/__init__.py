"""Curation in the Django admin: entries, a "try a question" tool, file import, misses, and the
calibration runs with the operating point each recommends. Django's autodiscover imports this
package; importing each module registers its admin classes."""

from knowledge.admin import calibrations, embedding_models, entries, misses

__all__ = ["calibrations", "embedding_models", "entries", "misses"]
