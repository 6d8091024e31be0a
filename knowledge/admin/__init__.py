"""Curation in the Django admin: entries, a "try a question" tool, file import, misses, the direct
answers with their review queue, and the calibration runs with the operating point each
recommends. Django's autodiscover imports this
package; importing each module registers its admin classes."""

from knowledge.admin import calibrations, embedding_models, entries, hits, misses

__all__ = ["calibrations", "embedding_models", "entries", "hits", "misses"]
