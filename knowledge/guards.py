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
_OPENERS = re.compile(
    r"^(?:and|but|so|also|then|or|what about|how about|what if|same for|and if)\b", re.I
)
# Words that point back at something said before (not "there": "is there a fee?" stands alone).
_REFERENCES = re.compile(
    r"\b(?:it|its|it's|that|this|these|those|they|them|their|theirs|one|ones|same)\b", re.I
)
# Chinese: opening with 那/那么/还有/另外/然后/如果这样, ending with 呢, or pointing back with
# 它/这个/那个/这样/那样.
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
    ("on", "off"),
    ("enable", "disable"),
    ("activate", "deactivate"),
    ("start", "stop"),
    ("open", "close"),
    ("add", "remove"),
    ("add", "delete"),
    ("create", "delete"),
    ("create", "revoke"),
    ("subscribe", "unsubscribe"),
    ("increase", "decrease"),
    ("upgrade", "downgrade"),
    ("log in", "log out"),
    ("login", "logout"),
    ("sign in", "sign out"),
    ("lock", "unlock"),
    ("before", "after"),
    ("import", "export"),
    ("upload", "download"),
    ("pause", "resume"),
    ("receive", "send"),
    ("buy", "sell"),
    ("join", "leave"),
    ("开通", "取消"),
    ("开通", "关闭"),
    ("打开", "关闭"),
    ("开启", "关闭"),
    ("启用", "停用"),
    ("启用", "禁用"),
    ("之前", "之后"),
    ("以前", "以后"),
    ("增加", "减少"),
    ("升级", "降级"),
    ("登录", "退出"),
    ("绑定", "解绑"),
    ("订阅", "退订"),
    ("上调", "下调"),
    ("上传", "下载"),
    ("导入", "导出"),
    ("暂停", "恢复"),
    ("锁定", "解锁"),
    ("添加", "删除"),
    ("新增", "删除"),
    ("创建", "删除"),
    ("创建", "停止"),
    ("创建", "撤销"),
    ("领取", "使用"),
    ("收到", "寄出"),
    ("购买", "出售"),
    ("加入", "退出"),
]
# Words that undo or repeat an action: "un-cancel an order", "recover a deleted account", "重新订阅"
# ask for the way back, which the entry for the action itself does not answer.
_REVERSALS = re.compile(
    r"\b(?:undo|un-?cancel\w*|un-?delete\w*|restore\w*|recover\w*|reactivat\w*|restart\w*|"
    r"resubscrib\w*|re-?enabl\w*|reopen\w*|revert\w*|reinstat\w*|get \w+ back)\b|"
    r"恢复|撤销|撤回|重新|找回|还原",
    re.I,
)
_NEGATION = re.compile(
    r"\b(?:not|no|never|without|don't|doesn't|didn't|can't|cannot|won't|isn't|aren't|"
    r"shouldn't|dont|doesnt|cant|wont)\b|不|没|别|无需|未",
    re.I,
)
# Words a negation skips to reach what it negates ("don't want to cancel", "not a refund").
_FILLER = frozenset(
    "i you we it to a an the my your our be do have want need like just please any".split()
)
# Every word of the pairs, found in one pass: whole words in Latin script, substrings in CJK.
_WORDS = sorted({word for pair in _OPPOSITES for word in pair}, key=len, reverse=True)
_OPPOSITE_WORDS = re.compile(
    "|".join(
        re.escape(word) if re.search(f"[{CJK_RANGES}]", word) else rf"\b{re.escape(word)}\b"
        for word in _WORDS
    )
)
_CJK = re.compile(f"[{CJK_RANGES}]")
_WORD = re.compile(r"[^\W_]+(?:'[a-z]+)?", re.I)
# A number with its unit ("7B", "70B", "16G", "v2"): a question about another number is another
# question.
_NUMBER = re.compile(r"(?<![^\W\d_])\d+(?:\.\d+)?[a-z]*", re.I)


def near_miss(question: str, phrasing: str) -> str | None:
    """Why `question` must not take the answer of the entry phrased `phrasing` although their
    vectors are close: one asks the opposite action or relation, asks to undo the entry's action,
    names another number, or negates what the other asks. None when no such sign is found."""
    q, p = question.casefold(), phrasing.casefold()
    asked = set(_OPPOSITE_WORDS.findall(q))
    known = set(_OPPOSITE_WORDS.findall(p))
    for one, other in _OPPOSITES:
        for this, that in ((one, other), (other, one)):
            if this in asked and that not in asked and that in known and this not in known:
                return f"it asks {this!r} where the entry says {that!r}"
    if (undo := _REVERSALS.search(q)) and not _REVERSALS.search(p):
        return f"it asks to {undo.group()!r}, which the entry does not"
    numbers_q, numbers_p = set(_NUMBER.findall(q)), set(_NUMBER.findall(p))
    if numbers_p and numbers_q and not numbers_q & numbers_p:
        return f"it names {sorted(numbers_q)[0]!r} where the entry says {sorted(numbers_p)[0]!r}"
    for this, that in ((q, p), (p, q)):
        if word := _negated_but_asked(this, that):
            return f"one of them negates {word!r} and the other asks it"
    return None


def _negated_but_asked(text: str, other: str) -> str | None:
    """A term `text` negates ("don't want to cancel", "不想取消") that `other` asks without
    negating."""
    negated = _negated_terms(text)
    if not negated:
        return None
    plain = _terms(other) - _negated_terms(other)
    found = negated & plain
    return min(found) if found else None


def _negated_terms(text: str) -> set[str]:
    """What the negations of `text` reach: the next word that is not filler in Latin script, the
    bigrams of the next four characters in CJK."""
    terms: set[str] = set()
    for match in _NEGATION.finditer(text):
        rest = text[match.end() :]
        if _CJK.match(match.group()):
            head = rest[:4]
            terms.update(
                head[i : i + 2]
                for i in range(len(head) - 1)
                if _CJK.match(head[i]) and _CJK.match(head[i + 1])
            )
            continue
        words = [w for w in _WORD.findall(rest[:60]) if w not in _FILLER][:1]
        terms.update(words)
    return terms


def _terms(text: str) -> set[str]:
    terms = set(_WORD.findall(_CJK.sub(" ", text)))
    for run in re.findall(f"[{CJK_RANGES}]+", text):
        terms.update(run[i : i + 2] for i in range(len(run) - 1))
    return terms
