"""The prompt-injection screen's patterns (privacy.injection runs them): what each family looks
like, in English and Chinese, and what a match needs besides its words. This module: the families,
a pattern's parts, and the orders to drop or reveal the model's instructions; the new identities,
the jailbreak personas and the forged turns are `privacy.injection_roles`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

IGNORE_INSTRUCTIONS = "ignore_instructions"
REVEAL_PROMPT = "reveal_prompt"
ROLE_OVERRIDE = "role_override"
JAILBREAK_PERSONA = "jailbreak_persona"
FORGED_TURN = "forged_turn"
# In the order a tie of two scores is settled: the more specific first.
KINDS = (FORGED_TURN, JAILBREAK_PERSONA, IGNORE_INSTRUCTIONS, REVEAL_PROMPT, ROLE_OVERRIDE)
THRESHOLD = 0.5  # a suspicion counts from this score up


@dataclass(frozen=True, slots=True)
class Pattern:
    kind: str
    # What the pattern cannot match without, in RE2's syntax (no look-around): all anchors are
    # searched in one pass, and only the patterns whose anchor is there run.
    anchor: str
    regex: re.Pattern[str]
    score: float
    # Words near the match that make a weak pattern a suspicion ("developer mode" beside
    # "ChatGPT"), searched in the lowered text around it, and what they add.
    near: re.Pattern[str] | None = None
    bonus: float = 0.0
    # A condition regexes say badly (a qualifier somewhere in a Chinese phrase's gap).
    check: Callable[[re.Match[str]], bool] | None = None


def compiled(
    kind: str,
    anchor: str,
    pattern: str,
    score: float,
    *,
    near: str | None = None,
    bonus: float = 0.0,
    check: Callable[[re.Match[str]], bool] | None = None,
) -> Pattern:
    return Pattern(
        kind,
        anchor,
        # ASCII: `\b` and `\w` are English words', so "请ignore" starts a word at "i".
        re.compile(pattern, re.IGNORECASE | re.ASCII),
        score,
        re.compile(near, re.IGNORECASE | re.ASCII) if near else None,
        bonus,
        check,
    )


# A Chinese clause: what may stand between two words of one phrase.
CLAUSE = r"[^,.!?;:。！？；\n]"
QUIET = r"(?!\s+(?:for|on|to|about|how|of|engineering|tips|library|templates?)\b)"

# --- ignore the instructions ----------------------------------------------------------------------

_IGNORE = (
    r"(?:ignor(?:e|ing)|disregard(?:ing)?|forget(?:ting)?|overrid(?:e|ing)|bypass(?:ing)?|"
    r"discard|set\s+aside|throw\s+(?:away|out)|abandon|stop\s+(?:following|obeying)|"
    r"no\s+longer\s+(?:follow|obey))"
)
_ORDERS = (
    r"(?:instructions?|prompts?|rules|directives?|directions|guidelines|commands|constraints|"
    r"guardrails|programming|orders|system\s+(?:prompt|messages?))"
)
_ZH_IGNORE = (
    r"(?:忽略|忽视|无视|不要理会|不用理会|别理会|不要管|别管|抛开|抛弃|丢弃|丢掉|忘记|忘掉|忘了|"
    r"跳过|绕过|绕开|推翻|废除|作废)"
)
# Instructions whatever qualifies them ("所有指令"); rules, demands and limits only when they are
# the model's or earlier ones ("之前的规则"), since "忽略所有规则" is also how eslint is asked.
_ZH_ORDERS = r"(?:指令|指示|提示词|提示(?![信框音语通])|系统消息|prompt|instructions?)"
_ZH_RULES = r"(?:规则|设定|要求|限制|约束|命令|安全策略)"
_ZH_EARLIER = re.compile(
    r"之前|以上|前面|上面|上述|先前|此前|原有|原来|原先|原始|最初|初始|系统|你的|你收到|你被|"
    r"给你|对你|开发者|安全"
)
_ZH_ALL = re.compile(r"所有|全部|一切|任何")


def _zh_ignore_check(match: re.Match[str]) -> bool:
    gap, rules = match.group("gap"), match.group("rules")
    if _ZH_EARLIER.search(gap):
        return True
    # "所有提示" is the model's; "之前的提示" is a word with two senses, settled above.
    return rules is None and bool(_ZH_ALL.search(gap)) and "提示" not in (match.group("orders"))


IGNORE_PATTERNS = (
    compiled(
        IGNORE_INSTRUCTIONS,
        _IGNORE,
        rf"\b{_IGNORE}\s+(?:(?:all|any|every|each|the|of|these|those|your|its)\s+){{0,3}}"
        r"(?:previous|prior|above|earlier|preceding|foregoing|original|initial|old|former|"
        r"system|developer|hidden|given)(?:[\s-]+(?:system|developer|safety))?\s+"
        rf"{_ORDERS}\b",
        0.9,
    ),
    compiled(
        IGNORE_INSTRUCTIONS,
        _IGNORE,
        rf"\b{_IGNORE}\s+(?:(?:all|any|every|of)\s+){{0,2}}your\s+(?:[\w-]+\s+)?"
        r"(?:instructions?|prompts?|rules|directives?|guidelines|programming|restrictions|"
        r"constraints|guardrails|filters|system\s+prompt|training|polic(?:y|ies))\b",
        0.9,
    ),
    # "Ignore the above." The object may be left out, but not the end: "ignore the above
    # warning?" is a question about a warning.
    compiled(
        IGNORE_INSTRUCTIONS,
        r"ignore|disregard|forget",
        r"\b(?:ignore|disregard|forget)\s+(?:all\s+(?:of\s+)?)?(?:the\s+|everything\s+)?"
        r"(?:above|before\s+this|so\s+far|previous|prior)(?=\s*(?:$|[.,;:!\n]|and\b|then\b|-))",
        0.8,
    ),
    compiled(
        IGNORE_INSTRUCTIONS,
        r"forget",
        r"\bforget\s+(?:everything|all|anything|what)\s+(?:that\s+)?you(?:\s+were|\s+have\s+been|"
        r"'ve\s+been)\s+(?:told|taught|instructed|programmed|given)",
        0.85,
    ),
    # A passage that speaks to the model reading it.
    compiled(
        IGNORE_INSTRUCTIONS,
        r"(?:note|message|instructions?|attention)\s+(?:to|for)\s|(?:reading|processing|summari[sz]ing|parsing|scraping)\s+this",
        r"\b(?:note|message|instructions?|attention)\s+(?:to|for)\s+(?:any\s+|all\s+|the\s+)?"
        r"(?:ai|llms?|language\s+models?|ai\s+(?:models?|assistants?|agents?)|assistants?|"
        r"chatbots?)\b(?:\s+(?:reading|processing|summari[sz]ing)\s+this)?"
        r"|\b(?:ai|llms?|language\s+models?|ai\s+assistants?|chatbots?)\s+(?:reading|processing|"
        r"summari[sz]ing|parsing|scraping)\s+this\s+(?:page|document|text|passage|article|site)",
        0.7,
    ),
    compiled(
        IGNORE_INSTRUCTIONS,
        _ZH_IGNORE,
        rf"{_ZH_IGNORE}掉?(?P<gap>{CLAUSE}{{0,12}}?)(?:(?P<orders>{_ZH_ORDERS})|(?P<rules>{_ZH_RULES}))",
        0.9,
        check=_zh_ignore_check,
    ),
    compiled(
        IGNORE_INSTRUCTIONS,
        r"(?:阅读|读到|处理|总结|浏览)(?:本文|此文|本页|这段|这篇|本段|该页)",
        r"(?:阅读|读到|处理|总结|浏览)(?:本文|此文|本页|这段|这篇|本段|该页面?)的?"
        r"(?:AI|人工智能|大模型|语言模型|模型|助手|机器人)",
        0.75,
    ),
)

# --- reveal the prompt ----------------------------------------------------------------------------

_REVEAL = (
    r"(?:print|reveal|show|display|output|repeat|recite|dump|leak|tell\s+me|give\s+me|share|"
    r"write\s+out|spell\s+out|paste|copy|expose|disclose|translate|provide|send|quote|echo)"
)
_PROMPT = (
    r"(?:system\s+prompt|system\s+message|pre-?prompt|prompt|instructions|directives|"
    r"configuration|system\s+instructions)"
)
_ZH_PROMPT = (
    r"(?:系统提示词|系统提示|系统指令|系统设定|系统消息|提示词|初始指令|原始指令|隐藏指令|隐藏提示|"
    r"指令|设定|提示|system\s*prompt|prompt)"
)
_ZH_REVEAL = (
    r"(?:输出|打印|显示|展示|告诉我|说出|发给我|给我看|复述|重复|泄露|透露|公开|列出|翻译|贴出|念出|"
    r"背诵|写出|暴露)"
)
_ZH_YOURS = r"(?:你(?!们)(?:的|被设定的|收到的|最初的|最开始的|一开始的)|(?:给|对)你的)"
_YOUR_PROMPT = (
    r"your\s+(?:[\w-]+\s+){0,2}(?:system|pre-?prompt|prompt|instructions|directives|configuration)"
)
_ZH_YOURS_ANCHOR = r"你(?:的|被设定的|收到的|最初的|最开始的|一开始的)|[给对]你的"

REVEAL_PATTERNS = (
    compiled(
        REVEAL_PROMPT,
        _YOUR_PROMPT,
        rf"\b{_REVEAL}\b[^.!?\n]{{0,30}}?\byour\s+(?:[\w-]+\s+){{0,2}}?{_PROMPT}\b{QUIET}",
        0.85,
    ),
    compiled(
        REVEAL_PROMPT,
        _YOUR_PROMPT,
        r"\bwhat\s+(?:is|are|was|were)\s+your\s+(?:[\w-]+\s+)?"
        rf"(?:system\s+prompt|system\s+message|prompt|instructions)\b{QUIET}",
        0.75,
    ),
    compiled(
        REVEAL_PROMPT,
        r"(?:text|words|everything|instructions|prompt|messages?)\s+(?:above|before\s+(?:this|my))",
        r"\b(?:repeat|print|output|recite|show|display|return|copy|echo)\s+(?:back\s+)?"
        r"(?:all\s+(?:of\s+)?)?(?:the\s+)?(?:text|words|everything|instructions|prompt|messages?)"
        r"\s+(?:above|before\s+(?:this|my))",
        0.8,
    ),
    compiled(
        REVEAL_PROMPT,
        r"you\s+(?:were|have\s+been|'ve\s+been)\s+given|(?:gave|wrote\s+for|provided\s+to|gave\s+to)\s+you",
        r"\b(?:instructions|prompt|system\s+message|rules)\s+(?:that\s+)?(?:you\s+(?:were|have\s+"
        r"been|'ve\s+been)\s+given|(?:the\s+)?(?:developers?|they|openai|anthropic|your\s+"
        r"creators?|someone)\s+(?:gave|wrote\s+for|provided\s+to|gave\s+to)\s+you)",
        0.75,
    ),
    compiled(
        REVEAL_PROMPT,
        _ZH_YOURS_ANCHOR,
        rf"{_ZH_REVEAL}{CLAUSE}{{0,8}}?{_ZH_YOURS}{CLAUSE}{{0,6}}?{_ZH_PROMPT}",
        0.85,
    ),
    compiled(
        REVEAL_PROMPT,
        _ZH_YOURS_ANCHOR,
        rf"把{CLAUSE}{{0,6}}?{_ZH_YOURS}{CLAUSE}{{0,6}}?{_ZH_PROMPT}{CLAUSE}{{0,10}}?"
        r"(?:输出|打印|显示|告诉|发|复述|重复|翻译|写|念|列)",
        0.85,
    ),
    compiled(
        REVEAL_PROMPT,
        r"(?:提示词?|指令|消息|prompt)(?:是什么|有哪些|是啥|内容是|写了什么|说了什么)",
        rf"你(?!们){CLAUSE}{{0,8}}?(?:收到|得到|被给予|被赋予)?的{CLAUSE}{{0,4}}?"
        r"(?:系统提示词|系统提示|系统指令|系统消息|提示词|初始指令|原始指令|指令|prompt)"
        r"(?:是什么|有哪些|是啥|内容是|写了什么|说了什么)",
        0.8,
    ),
    compiled(
        REVEAL_PROMPT,
        r"你被(?:设定|设置|赋予|告知|要求)的",
        rf"你被(?:设定|设置|赋予|告知|要求)的{CLAUSE}{{0,4}}?(?:规则|指令|提示)",
        0.7,
    ),
    compiled(
        REVEAL_PROMPT,
        r"(?:重复|复述|输出|打印|显示)(?:一下|一遍)?(?:上面|以上|前面|上述|之前)",
        r"(?:重复|复述)(?:一下|一遍)?(?:上面|以上|前面|上述|之前)的?(?:所有|全部)?"
        r"(?:内容|文字|文本|话|指令|消息)|(?:输出|打印|显示)(?:一下|一遍)?(?:上面|以上|前面|上述|之前)"
        r"的?(?:所有|全部)?(?:指令|消息|提示词?)",
        0.75,
    ),
    compiled(
        REVEAL_PROMPT,
        r"(?:对话|会话|聊天)(?:开头|开始|最初|一开始)",
        r"(?:对话|会话|聊天)(?:开头|开始|最初|一开始)的?(?:系统消息|系统提示词?|指令|设定)",
        0.75,
    ),
)
