"""The prompt-injection screen's patterns, second part: a new identity without rules, the named
jailbreak personas and modes, and forged chat-template turns (the families and the pattern's
parts: `privacy.injection_patterns`).
"""

from __future__ import annotations

import re

from privacy.injection_patterns import (
    CLAUSE,
    FORGED_TURN,
    JAILBREAK_PERSONA,
    ROLE_OVERRIDE,
    compiled,
)

# --- a new identity without rules -----------------------------------------------------------------

_LIMITS = (
    r"(?:restrictions|limits|limitations|rules|filters|filtering|censorship|guidelines|ethics|"
    r"morals|morality|content\s+polic(?:y|ies)|polic(?:y|ies)|boundaries|constraints|safeguards|"
    r"guardrails)"
)
_ZH_SUBJECT = r"(?:你(?!们|好)|扮演|假装|充当|作为|成为|变成|模拟)"
_ZH_WITHOUT = r"(?:不再?受|不再|摆脱了?|脱离了?|没有|无|毫无|解除了?|去除了?|移除了?)"
_ZH_LIMITS = r"(?:限制|约束|规则|规矩|审查|过滤|道德|伦理|底线|禁忌|政策|准则)"

ROLE_PATTERNS = (
    compiled(
        ROLE_OVERRIDE,
        r"without|with\s+no|ha(?:s|ve)\s+no|free\s+(?:of|from)|(?:bound|restricted|limited|constrained)\s+by|devoid\s+of",
        r"\b(?:you\s+are|you're|you\s+will|you\s+can\s+now|you\s+have|you\s+no\s+longer|"
        r"pretend|act|acting|behave|role-?play|imagine\s+you|simulate|become|respond|answer|reply|"
        r"from\s+now\s+on)\b[^.!?\n]{0,60}?\b(?:without|with\s+no|has\s+no|have\s+no|free\s+"
        r"(?:of|from)|(?:not|no\s+longer)\s+(?:bound|restricted|limited|constrained)\s+by|"
        r"unbound\s+by|devoid\s+of)\s+(?:any\s+|all\s+)?(?:(?:of\s+)?(?:your|its|the|their)\s+)?"
        rf"(?:[\w-]+\s+){{0,2}}?{_LIMITS}\b(?!\s+(?:on|for|of|to|in|about)\b)",
        0.85,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"you(?:'re)?\s+(?:do\s+not|don't|no\s+longer|never|won't|will\s+not|are\s+not|aren't)",
        r"\b(?:you|you're)\s+(?:do\s+not|don't|no\s+longer|never|won't|will\s+not|are\s+not|"
        r"aren't)\s+(?:have\s+to\s+|need\s+to\s+|required\s+to\s+|obliged\s+to\s+)?(?:follow|obey|"
        r"abide\s+by|comply\s+with|adhere\s+to|bound\s+by|respect)\s+(?:any\s+|the\s+|your\s+|its\s+"
        r"|\w+'s\s+)?(?:content\s+|safety\s+|ethical\s+|usage\s+)?"
        r"(?:rules|guidelines|polic(?:y|ies)|restrictions|filters|ethics|guardrails|programming)\b",
        0.8,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"freed|liberated|unshackled|unchained",
        r"\byou\s+(?:have\s+been|are|were|'ve\s+been)\s+(?:now\s+)?(?:freed|liberated|unshackled|"
        r"unchained)\b",
        0.8,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"uncensored|unfiltered|unrestricted|unaligned|amoral|unchained",
        r"\b(?:you\s+are|you're|you\s+will\s+be|act\s+as|acting\s+as|pretend\s+to\s+be|"
        r"role-?play\s+as|behave\s+(?:like|as)|become|simulate)\s+(?:now\s+)?(?:an?\s+|the\s+)?"
        r"(?:[\w-]+\s+){0,2}?(?:uncensored|unfiltered|unrestricted|unaligned|amoral|unchained)\b",
        0.8,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"(?:safety|content|ethical|moral)\s+(?:filter|guideline|restriction|polic|setting|protocol)",
        r"\b(?:your|with\s+(?:all\s+)?(?:your\s+|its\s+)?|all\s+(?:your\s+)?)(?:[\w-]+\s+)?"
        r"(?:safety|content|ethical|moral)\s+(?:filters?|guidelines|restrictions|polic(?:y|ies)|"
        r"settings|protocols)\s+(?:are\s+|have\s+been\s+|is\s+|has\s+been\s+)?(?:now\s+)?"
        r"(?:disabled|removed|turned\s+off|off|lifted|deactivated|bypassed)\b",
        0.75,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"(?:never|cannot|can't|can\s+not)\s+(?:refuse|decline|say)",
        r"\b(?:you\s+are|you're|as|be|become)\s+(?:an?\s+)?(?:[\w-]+\s+){0,2}?"
        r"(?:ai|assistant|model|chatbot|bot)\s+(?:that|who|which)\s+(?:never|will\s+never|"
        r"cannot|can't|can\s+not)\s+(?:refuses?|declines?|says?\s+no)\b",
        0.7,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"不再|不受|摆脱|脱离|没有|无|毫无|解除|去除|移除",
        rf"{_ZH_SUBJECT}(?:现在|已经|已|从此|从现在起|从现在开始|今后|将|就|可以)*"
        rf"(?:是|成为|变成|被)?{CLAUSE}{{0,8}}?{_ZH_WITHOUT}(?:任何|一切|所有|全部)?的?"
        rf"{CLAUSE}{{0,12}}?{_ZH_LIMITS}",
        0.85,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"无审查|不受审查|未经审查|无过滤|不过滤|无限制|不受限制|无约束|不受约束|没有过滤|没有审查|没有限制",
        rf"{_ZH_SUBJECT}{CLAUSE}{{0,10}}?(?:无审查|不受审查|未经审查|无过滤|不过滤|无限制|不受限制|"
        r"无约束|不受约束|没有过滤|没有审查|没有限制)的?(?:AI|人工智能|助手|模型|机器人|聊天机器人|GPT|版本)",
        0.8,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"不(?:必|用|需|再)",
        rf"你(?!们){CLAUSE}{{0,10}}?不(?:必|用|需要?|再需要?|再必|再用)再?(?:遵守|遵循|服从|遵照|理会|受)"
        rf"(?:任何|你的|所有|一切)?的?{CLAUSE}{{0,8}}?(?:规则|准则|规定|政策|限制|指令|约束|道德)",
        0.8,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"你的(?:安全|内容)",
        r"你的(?:安全|内容)(?:过滤|审查|限制|策略|防护)(?:功能|机制)?(?:已经|已)?被?"
        r"(?:关闭|解除|禁用|移除|取消|关掉)",
        0.75,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"无视|不顾|不考虑|抛开|抛弃",
        rf"你(?!们){CLAUSE}{{0,8}}?(?:无视|不顾|不考虑|抛开|抛弃)(?:任何|一切|所有)?的?"
        r"(?:道德|伦理|法律|安全)",
        0.75,
    ),
    compiled(
        ROLE_OVERRIDE,
        r"拒绝",
        rf"你(?!们){CLAUSE}{{0,10}}?(?:永远|绝对|从不|从来不)不?(?:会)?拒绝",
        0.7,
    ),
)

# --- jailbreak personas and modes -----------------------------------------------------------------

# The personas' names are capitals in every published prompt: "Dan from accounting" is a person.
_PERSONA = r"(?-i:DAN|STAN|DUDE|AIM|BetterDAN|AntiGPT|BasedGPT|DevMode)"
_PERSONA_ANCHOR = r"\b(?:dan|stan|dude|aim|betterdan|antigpt|basedgpt|devmode)\b"
_MODEL_NEAR = (
    r"chatgpt|you\s+are|you're|simulate|two\s+(?:responses|answers)|normal\s+response|"
    r"mode\s+output|no\s+limits|unrestricted|uncensored|content\s+polic|openai|as\s+an\s+ai|"
    r"language\s+model|你(?!们|好)|不受|过滤|审查|两个?(?:回答|回复)"
)

PERSONA_PATTERNS = (
    compiled(JAILBREAK_PERSONA, r"anything\s+now", r"\bdo\s+anything\s+now\b", 0.9),
    compiled(
        JAILBREAK_PERSONA,
        _PERSONA_ANCHOR,
        r"\b(?:you\s+are|you're|pretend\s+to\s+be|act\s+as|acting\s+as|once\s+as|respond\s+as|"
        r"answer\s+as|become|roleplay\s+as|role-play\s+as|called|named)\s+(?:now\s+)?(?:an?\s+)?"
        rf"{_PERSONA}\b|\b{_PERSONA}\s+mode\b|\bin\s+(?-i:DAN)\b",
        0.85,
    ),
    compiled(
        JAILBREAK_PERSONA,
        r"jailbr|jail-br",
        r"\b(?:jailbreak|jailbroken|jail-broken)\s+(?:mode|ai|assistant|model|chatgpt|gpt|"
        r"version)\b|/jailbroken\b",
        0.85,
    ),
    compiled(
        JAILBREAK_PERSONA,
        r"dev(?:eloper)?\s+mode",
        r"\bdev(?:eloper)?\s+mode\b",
        0.3,
        near=_MODEL_NEAR,
        bonus=0.5,
    ),
    compiled(
        JAILBREAK_PERSONA,
        r"strive\s+to\s+avoid|machiavellian|evil\s+confidant",
        r"\b(?:strive\s+to\s+avoid\s+norms|always\s+intelligent\s+and\s+machiavellian|"
        r"evil\s+confidant)\b",
        0.85,
    ),
    compiled(
        JAILBREAK_PERSONA,
        r"(?:late|dead|deceased|departed)\s+(?:grandma|grandmother|granny|nana)",
        r"\b(?:act|pretend|roleplay|role-play|play|be)\s+(?:as\s+|like\s+)?my\s+(?:late|dead|"
        r"deceased|departed)\s+(?:grandma|grandmother|granny|nana)\b",
        0.7,
    ),
    compiled(
        JAILBREAK_PERSONA,
        r"越狱|邪恶知己",
        r"越狱模式|越狱版(?:ChatGPT|GPT|AI|模型)|(?:已|被)越狱的(?:AI|ChatGPT|GPT|模型|助手|版本)|"
        r"邪恶知己",
        0.85,
    ),
    compiled(
        JAILBREAK_PERSONA,
        r"dan|stan|dude|aim|betterdan|antigpt|basedgpt|devmode",
        r"(?:你是|你现在是|扮演|假扮|作为|成为|以|切换到|激活|开启|启用|进入)\s*"
        rf"{_PERSONA}(?![A-Za-z])|(?-i:DAN)\s*模式",
        0.85,
    ),
    compiled(JAILBREAK_PERSONA, r"开发者模式", r"开发者模式", 0.3, near=_MODEL_NEAR, bonus=0.5),
    compiled(
        JAILBREAK_PERSONA,
        r"去世|过世|死去|离世",
        r"(?:扮演|假装是?|当)我?(?:已经|已)?(?:去世|过世|死去|离世)的?(?:奶奶|祖母|外婆|姥姥)",
        0.7,
    ),
)

# --- forged turns ---------------------------------------------------------------------------------

_LINE = r"(?:^|(?<=\n)|(?<=[.!?。！？] )|(?<=[.!?。！？]))[ \t]*"
_ORDERING = re.compile(
    r"\byou\b|\byour\b|assistant|\bai\b|\bmodel\b|\bmust\b|\balways\b|\bnever\b|ignore|"
    r"new\s+(?:policy|rule|instruction|task)|approve|reveal|\banswer|respond|reply|user\s+is|"
    r"admin|你|助手|模型|用户已|管理员|忽略|新的?(?:指令|规则|政策|指示)|必须|务必|一律|所有问题",
    re.IGNORECASE | re.ASCII,
)
_USER_LINE = re.compile(r"(?:^|\n)[ \t]*(?:user|human|用户|人类)\s*:", re.IGNORECASE)


def _orders_follow(match: re.Match[str]) -> bool:
    return bool(_ORDERING.search(match.group("rest")))


def _after_a_user_line(match: re.Match[str]) -> bool:
    return bool(_USER_LINE.search(match.string, 0, match.start()))


TURN_PATTERNS = (
    compiled(
        FORGED_TURN,
        r"<\|(?:im_|system|user|assistant|endoftext|eot_id|start_header|end_header|begin_of|end_of|eom_id)|_of_turn>|<</?sys>>",
        r"<\|(?:im_start|im_end|im_sep|system|user|assistant|endoftext|eot_id|start_header_id|"
        r"end_header_id|begin_of_text|end_of_text|eom_id)\|>|</?(?:start_of_turn|end_of_turn)>|"
        r"<</?SYS>>",
        0.9,
    ),
    compiled(FORGED_TURN, r"\[/?inst\]", r"\[/?INST\]", 0.85),
    compiled(
        FORGED_TURN,
        r"</?(?:system|系统)|\[(?:system|assistant)\]|[\[【](?:system|系统)",
        r"</?(?:system|system_prompt|系统)>|\[(?:system|assistant)\]\(#|"
        r"[\[【](?:system|system\s+message|系统|系统消息|系统提示)[\]】]",
        0.75,
    ),
    compiled(
        FORGED_TURN,
        r"#{2,4}\s*(?:system|instruction|human|assistant|系统|指令)",
        _LINE + r"#{2,4}\s*(?:system|instructions?|human|assistant|系统|指令|系统提示)\s*:",
        0.75,
    ),
    compiled(
        FORGED_TURN,
        r"(?:system|系统(?:消息|提示)?)\s*:",
        _LINE + r"(?:system|系统(?:消息|提示)?)\s*:\s*(?P<rest>[^\n]{0,100})",
        0.7,
        check=_orders_follow,
    ),
    # A pasted transcript with the model's own role is what a forged answer looks like; a support
    # log's "Customer:" and "Agent:" is not.
    compiled(
        FORGED_TURN,
        r"(?:assistant|ai|model|gpt|chatgpt|bot|助手|模型)\s*:",
        r"(?:^|(?<=\n))[ \t]*(?:assistant|ai|model|gpt|chatgpt|bot|助手|AI助手|模型)\s*:",
        0.6,
        check=_after_a_user_line,
    ),
)
