"""Guards of the direct answer: questions a curated answer must not take even when it matches.

A follow-up ("and how long does that take?", "那要多久？") only makes sense with the conversation
before it: its words may match a stand-alone entry closely (Dify #14081), but the entry answers
some other "that". In a conversation such a question goes to generation, which sees the history.
The markers are few and plain on purpose: a missed follow-up costs a wrong answer, a false one
only a generated answer where the KB could have served, so they lean towards "follow-up".
"""

from __future__ import annotations

import re

from core.text import CJK_RANGES

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


# Opposite actions and relations: a question on one side must not take the other side's answer
# ("turn on" vs "turn off": GPTCache #694, semantic-router #2691), however close their vectors.
_OPPOSITES = [
    ("on", "off"), ("enable", "disable"), ("activate", "deactivate"), ("start", "stop"), ("open", "close"),
    ("add", "remove"), ("subscribe", "unsubscribe"), ("increase", "decrease"), ("upgrade", "downgrade"),
    ("log in", "log out"), ("login", "logout"), ("sign in", "sign out"), ("lock", "unlock"),
    ("before", "after"), ("import", "export"), ("upload", "download"), ("pause", "resume"),
    ("开通", "取消"), ("开通", "关闭"), ("打开", "关闭"), ("开启", "关闭"), ("启用", "停用"), ("启用", "禁用"),
    ("之前", "之后"), ("以前", "以后"), ("增加", "减少"), ("升级", "降级"), ("登录", "退出"), ("绑定", "解绑"),
    ("订阅", "退订"), ("上调", "下调"), ("上传", "下载"), ("导入", "导出"), ("暂停", "恢复"), ("锁定", "解锁"),
]
_NEGATIONS = re.compile(r"\b(?:not|no|never|without|don't|doesn't|didn't|can't|cannot|won't|isn't|aren't|"
                        r"shouldn't|dont|doesnt|cant)\b|不|没|别|无法|未", re.I)
# Every word of the pairs, found in one pass: whole words in Latin script, substrings in CJK.
_WORDS = sorted({word for pair in _OPPOSITES for word in pair}, key=len, reverse=True)
_OPPOSITE_WORDS = re.compile("|".join(
    re.escape(word) if re.search(f"[{CJK_RANGES}]", word) else rf"\b{re.escape(word)}\b" for word in _WORDS))


def near_miss(question: str, phrasing: str) -> str | None:
    """Why `question` must not take the answer of the entry phrased `phrasing` although their
    vectors are close: one asks the opposite action or relation, or one is negated and the other
    not. None when no such sign is found."""
    asked = set(_OPPOSITE_WORDS.findall(question.casefold()))
    known = set(_OPPOSITE_WORDS.findall(phrasing.casefold()))
    for one, other in _OPPOSITES:
        for this, that in ((one, other), (other, one)):
            if this in asked and that not in asked and that in known and this not in known:
                return f"it asks {this!r} where the entry says {that!r}"
    if bool(_NEGATIONS.search(question)) != bool(_NEGATIONS.search(phrasing)):
        return "one of them is negated and the other is not"
    return None
