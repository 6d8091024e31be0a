"""Hostile Markdown for the renderer's tests: fixed cases and a seeded generator of random ones.

Shared by tests/chat/test_markdown.py (the renderer in node) and tests/chat/test_browser.py (the
renderer and its sanitizer in Chromium)."""

import html
import random
import re

EXPLOIT = (
    "- https://a/x/onmouseover=location=/javascript:alert%281%29/.source//\n  https://e.com/$`"
)

HOSTILE = [
    EXPLOIT,
    "- https://a/x/onmouseover=window.pwned=1//\n  https://e.com/$`",
    "- a\n  $& $' $` $1 $$ $<x> $0",
    "- <b>x</b> `y`\n  https://e.com/$&",
    "# $` and $&\n| $' | $1 |\n|---|---|\n| $` | $& |",
    "\u0000",
    "\u00000\u0000 `code` \u00000\u0000",
    "`a` \u00001\u0000 [b](https://x.y)",
    "\ufffd0\ufffd",
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x]( javascript:alert(1) )",
    "[x](java&#115;cript:alert(1))",
    "[x](&#106;avascript:alert(1))",
    "[x](%6Aavascript:alert(1))",
    "[x](<javascript:alert(1)>)",
    "[x](java\nscript:alert(1))",
    "[x](data:text/html;base64,PHNjcmlwdD4=)",
    "[x](vbscript:msgbox(1))",
    "[x](file:///etc/passwd)",
    "[x](//evil.example)",
    "[x](/admin/)",
    "[x][r]\n\n[r]: javascript:alert(1)",
    "<javascript:alert(1)>",
    "<data:text/html,<script>alert(1)</script>>",
    "javascript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox(1)",
    "![x](javascript:alert(1))",
    "![x](https://a.b/c.png)",
    "[![x](https://a.b/c.png)](https://a.b)",
    '[a](https://x.y/"onmouseover="alert(1))',
    'https://x.y/"><script>alert(1)</script>',
    '<https://x.y/"onclick="alert(1)">',
    '[a](https://x.y/ "t\\" onclick=\\"alert(1)")',
    "[a](https://x.y/'onmouseover='alert(1))",
    "https://x.y/<img/src/onerror=alert(1)>",
    "[a](https://x.y/ onmouseover=alert(1))",
    "[a](<https://x.y/ onmouseover=alert(1)>)",
    '[" onmouseover="alert(1)](https://x.y)',
    "[<img src=x onerror=alert(1)>](https://x.y)",
    "# <script>alert(1)</script>",
    "###### <img src=x onerror=alert(1)>",
    "- <svg onload=alert(1)>",
    "1. <iframe src=javascript:alert(1)>",
    "> <style>*{}</style>",
    "> - <b onclick=alert(1)>x</b>",
    "| <script>x</script> | <b>y</b> |\n|---|---|\n| <img src=x onerror=alert(1)> | `<i>` |",
    "`</code><script>alert(1)</script>`",
    "```\n</pre><script>alert(1)</script>\n```",
    '```"><img src=x onerror=alert(1)>\nx\n```',
    "```js onload=alert(1)\nx\n```",
    "``` <script>\nx\n```",
    "~~~ja&quot;va\nx",
    "    <script>indented code</script>",
    "**<iframe src=javascript:alert(1)>**",
    "*<b>x</b>*",
    "~~<s onclick=x>y</s>~~",
    "<!-- comment --><script>alert(1)</script>",
    "<div><p onclick=alert(1)>x</p></div>",
    "&lt;script&gt; &amp; &#60;b&#62; &quot; &#x27;",
    "&#0; &#xD800; &#99999999;",
    "\u2028\u2029\u200b<\u0000script>",
    "<scr\u0000ipt>alert(1)</script>",
    "1234567890. too many digits",
    "0. zero",
    "999999999. nine digits",
    "- a\n  - b\n    - c\n      - <b>d</b>",
    "> > > > > deep <b>quote</b>",
]

FRAGMENTS = [
    "<",
    ">",
    '"',
    "'",
    "&",
    "`",
    "```",
    "~~~",
    "*",
    "**",
    "_",
    "__",
    "~~",
    "[",
    "]",
    "(",
    ")",
    "!",
    "|",
    "\\",
    "\\|",
    "#",
    "# ",
    "- ",
    "* ",
    "1. ",
    "3) ",
    "> ",
    "  ",
    "    ",
    "\n",
    "\n\n",
    "\t",
    "---",
    ":--",
    "--:",
    "$`",
    "$&",
    "$'",
    "$1",
    "$$",
    "\u0000",
    "\ufffd",
    "\u00000\u0000",
    "https://",
    "http://",
    "https://a.b/",
    "javascript:",
    "JaVaScRiPt:",
    "data:",
    "vbscript:",
    "//",
    "www.",
    "mailto:a@b.c",
    "a@b.c",
    "onmouseover=",
    "onerror=",
    "<script>",
    "</script>",
    "<img src=x onerror=alert(1)>",
    "<a href=",
    "&quot;",
    "&lt;",
    "&#39;",
    "&#106;",
    "%22",
    "%3C",
    "alert(1)",
    "x",
    "word ",
    "é",
    "中文",
]


def random_sources(count: int, *, seed: int) -> list[str]:
    """Random sequences of Markdown syntax, hostile fragments and words, reproducible by seed."""
    rng = random.Random(seed)
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 40))) for _ in range(count)]


# What the renderer may write: each tag with the attributes it may carry.
ALLOWED = {
    "p": set(),
    "br": set(),
    "strong": set(),
    "em": set(),
    "s": set(),
    "code": {"data-lang"},
    "pre": set(),
    "blockquote": set(),
    "hr": set(),
    "h3": set(),
    "h4": set(),
    "h5": set(),
    "h6": set(),
    "ul": set(),
    "ol": {"start"},
    "li": set(),
    "a": {"href", "title", "rel", "target"},
    "table": set(),
    "thead": set(),
    "tbody": set(),
    "tr": set(),
    "th": {"class"},
    "td": {"class"},
}
VOID = {"br", "hr"}
VALUES = {
    "rel": re.compile(r"noopener noreferrer\Z"),
    "target": re.compile(r"_blank\Z"),
    "start": re.compile(r"\d{1,9}\Z"),
    "class": re.compile(r"align-(left|center|right)\Z"),
    "data-lang": re.compile(r"[A-Za-z0-9_+#.-]{1,32}\Z"),
    "href": re.compile(r"https?://", re.IGNORECASE),
    "title": re.compile(r".*", re.DOTALL),
}
TAG = re.compile(r'<(/?)([a-z][a-z0-9]*)((?: [a-z-]+="[^"<>]*")*)>')
ATTRIBUTE = re.compile(r' ([a-z-]+)="([^"<>]*)"')
# Text and attribute values: no character that could open a tag or close an attribute, and `&`
# only as the entities an escaper writes.
TEXT = re.compile(r'(?:[^<>"&]|&(?:amp|lt|gt|quot|#39);)*\Z')


def markup_problems(output: str) -> list[str]:
    """What in `output` is not markup the renderer writes itself; empty when all is.

    Stricter than parsing it: anything outside a plain grammar of allowed tags, double-quoted
    allowed attributes and escaped text counts, and the tags must nest and close."""
    problems = []
    stack = []
    position = 0
    while position < len(output):
        opening = output.find("<", position)
        text = output[position:] if opening == -1 else output[position:opening]
        if not TEXT.match(text):
            problems.append(f"unescaped text {text!r}")
        if opening == -1:
            break
        tag = TAG.match(output, opening)
        if not tag:
            problems.append(f"not a plain tag at {output[opening : opening + 60]!r}")
            break
        closing, name, attributes = tag.group(1), tag.group(2), tag.group(3)
        if name not in ALLOWED:
            problems.append(f"tag <{name}>")
        elif closing:
            if attributes or not stack or stack.pop() != name:
                problems.append(f"misplaced </{name}>")
        else:
            for attribute, value in ATTRIBUTE.findall(attributes):
                if attribute not in ALLOWED[name]:
                    problems.append(f"attribute {attribute} on <{name}>")
                elif not TEXT.match(value) or not VALUES[attribute].match(html.unescape(value)):
                    problems.append(f"{attribute}={value!r} on <{name}>")
            if name not in VOID:
                stack.append(name)
        position = tag.end()
    if stack:
        problems.append(f"unclosed {stack}")
    return problems
