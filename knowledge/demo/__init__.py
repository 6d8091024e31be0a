"""Demo knowledge base loaded by `make run` into an empty KB."""

from pathlib import Path

from knowledge.importing import ImportReport, kb_import
from knowledge.models import Entry

DEMO_FILE = Path(__file__).with_name("kb.jsonl")


def demo_kb_load() -> ImportReport | None:
    """Load the demo entries unless the KB has entries already (a curator's edits are never
    undone)."""
    if Entry.objects.exists():
        return None
    return kb_import(text=DEMO_FILE.read_text(encoding="utf-8"), fmt="jsonl", embed="sync")
