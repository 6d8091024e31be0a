"""Guards of the direct answer: questions a curated answer must not take even when it matches.

A follow-up ("and how long does that take?", "那要多久？") only makes sense with the conversation
before it: its words may match a stand-alone entry closely (Dify #14081), but the entry answers
some other "that". In a conversation such a question goes to generation, which sees the history.
The markers are few and plain on purpose: a missed follow-up costs a wrong answer, a false one
only a generated answer where the KB could have served, so they lean towards "follow-up".
"""

from __future__ import annotations

import re

# A question that opens by continuing the last one.
_OPENERS = re.compile(r"^(?:and|but|so|also|then|or|what about|how about|what if|same for|and if)\b", re.I)
# Words that point back at something said before (not "there": "is there a fee?" stands alone).
_REFERENCES = re.compile(r"\b(?:it|its|it's|that|this|these|those|they|them|their|theirs|one|ones|same)\b", re.I)
# Chinese: opening with 那/那么/还有/另外/然后/如果这样, ending with 呢, or pointing back with 它/这个/那个/这样/那样.
_ZH_OPENERS = re.compile(r"^(?:那么|那|还有|另外|然后|如果这样|这样的话)")
_ZH_REFERENCES = re.compile(r"它|这个|那个|这样|那样|上面|刚才|之前说")
_ZH_ENDINGS = re.compile(r"呢[？?。.!！]*$")


def follow_up_marker(text: str) -> str | None:
    """What makes `text` read as a follow-up to an earlier message (the words found), or None
    when it reads as a question of its own."""
    stripped = text.strip()
    for pattern in (_OPENERS, _ZH_OPENERS, _ZH_ENDINGS):
        if found := pattern.search(stripped):
            return found.group().strip("？?。.!！ ")
    for pattern in (_REFERENCES, _ZH_REFERENCES):
        if found := pattern.search(stripped):
            return found.group()
    return None
