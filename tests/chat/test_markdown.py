"""The chat's Markdown renderer (chat/static/chat/markdown.js) on hostile and ordinary input, in
node: tests/chat/render_markdown.js runs the page's scripts in the order the page loads them.

What is checked here is the renderer's own HTML (GatewayMarkdown.toHtml): it alone must never
write markup it did not mean to. The sanitizer the page puts behind it, and the page itself, are
checked in Chromium by tests/chat/test_browser.py.
"""

import html
import json
import re
import shutil
import subprocess

import pytest

from tests.chat.hostile_markdown import EXPLOIT, HOSTILE, markup_problems, random_sources
from tests.support.processes import BASE_DIR

STATIC = BASE_DIR / "chat/static/chat"
# The order of templates/chat/chat.html.
SCRIPTS = [
    STATIC / "vendor/markdown-it.min.js",
    STATIC / "vendor/purify.min.js",
    STATIC / "markdown.js",
]
HARNESS = BASE_DIR / "tests/chat/render_markdown.js"


def render_all(sources: list[str]) -> list[dict]:
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "node is missing: the Markdown tests run the renderer in node "
            "(apt-get install -y nodejs)"
        )
    done = subprocess.run(
        [node, str(HARNESS), *map(str, SCRIPTS)],
        input=json.dumps(sources),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def render(source: str) -> str:
    return render_all([source])[0]["html"]


def compact(output: str) -> str:
    """The output without the newlines markdown-it puts between tags, for readable expectations."""
    return re.sub(r"\n(?=<)|(?<=>)\n", "", output)


def test_the_reported_exploit_gives_two_plain_links_and_no_live_attribute():
    output = render(EXPLOIT)
    assert markup_problems(output) == []
    assert compact(output) == (
        '<ul><li><a href="https://a/x/onmouseover=location=/javascript:alert%281%29/.source//" '
        'rel="noopener noreferrer" target="_blank">https://a/x/onmouseover=location=/javascript:alert(1)/.source//'
        '</a><br><a href="https://e.com/$%60" rel="noopener noreferrer" target="_blank">https://e.com/$`</a></li></ul>'
    )


@pytest.mark.parametrize("pattern", ["$&", "$'", "$`", "$1", "$$", "$<x>", "$0"])
def test_replacement_patterns_in_any_construct_stay_literal_text(pattern):
    sources = [
        f"- item\n  {pattern} tail",
        f"# {pattern}",
        f"> {pattern}",
        f"| {pattern} |\n|---|\n| {pattern} |",
        f"`{pattern}`",
        f"[{pattern}](https://x.y/{pattern})",
        f"**{pattern}** {pattern}",
        f"1. a\n   https://e.com/{pattern}",
    ]
    for source, result in zip(sources, render_all(sources), strict=True):
        output = result["html"]
        assert markup_problems(output) == [], source
        if "`" not in pattern:  # a backtick may open a code span: Markdown, not a leak
            assert pattern in html.unescape(re.sub(r"<[^>]*>", "", output)), (source, output)


def test_nul_and_placeholder_lookalikes_never_pull_in_other_markup():
    for source in [
        "\u00000\u0000 `code` \u00000\u0000",
        "`a` \u00001\u0000 [b](https://x.y)",
        "\ufffd0\ufffd `c`",
    ]:
        output = render(source)
        assert markup_problems(output) == [], source
        assert output.count("<code>") == 1 and output.count("<a ") == source.count("](https"), (
            source,
            output,
        )
        assert "\u0000" not in output


@pytest.mark.parametrize(
    "source",
    [
        "[x](javascript:alert(1))",
        "[x](JaVaScRiPt:alert(1))",
        "[x]( javascript:alert(1) )",
        "[x](java&#115;cript:alert(1))",
        "[x](&#106;avascript:alert(1))",
        "[x](%6Aavascript:alert(1))",
        "[x](<javascript:alert(1)>)",
        "[x](data:text/html;base64,PHNjcmlwdD4=)",
        "[x](vbscript:msgbox(1))",
        "[x](file:///etc/passwd)",
        "[x](//evil.example)",
        "[x](/admin/)",
        "[x][r]\n\n[r]: javascript:alert(1)",
        "<javascript:alert(1)>",
        "javascript:alert(1)",
        "data:text/html,<script>alert(1)</script>",
        "vbscript:msgbox(1)",
        "![x](javascript:alert(1))",
        "mailto:a@b.c",
        "a@b.c",
        "www.example.com",
        "manage.py",
    ],
)
def test_only_http_and_https_urls_become_links(source):
    output = render(source)
    assert markup_problems(output) == []
    assert "<a " not in output and "<img" not in output, output


def test_quotes_and_angle_brackets_in_urls_stay_inside_the_attribute():
    cases = {
        '[a](https://x.y/"onmouseover="alert(1))': "https://x.y/%22onmouseover=%22alert(1)",
        "[a](https://x.y/'onmouseover='alert(1))": "https://x.y/'onmouseover='alert(1)",
        '<https://x.y/"onclick="alert(1)">': "https://x.y/%22onclick=%22alert(1)%22",
        'https://x.y/"><script>alert(1)</script>': "https://x.y/",
        "[a](<https://x.y/ onmouseover=alert(1)>)": "https://x.y/%20onmouseover=alert(1)",
    }
    for source, href in cases.items():
        output = render(source)
        assert markup_problems(output) == [], source
        assert re.findall(r'href="([^"]*)"', output) == [href], (source, output)
    titled = render('[a](https://x.y/ "t\\" onclick=\\"alert(1)")')
    assert markup_problems(titled) == []
    assert 'title="t&quot; onclick=&quot;alert(1)"' in titled


@pytest.mark.parametrize(
    "source",
    [
        "# <script>alert(1)</script>",
        "###### <img src=x onerror=alert(1)>",
        "- <svg onload=alert(1)>",
        "1. <iframe src=javascript:alert(1)>",
        "> <style>*{}</style>",
        "> - <b onclick=alert(1)>x</b>",
        "| <script>x</script> | <b>y</b> |\n|---|---|\n| <img src=x onerror=alert(1)> | `<i>` |",
        "`</code><script>alert(1)</script>`",
        "```\n</pre><script>alert(1)</script>\n```",
        "    <script>x</script>",
        '[" onmouseover="alert(1)](https://x.y)',
        "[<img src=x onerror=alert(1)>](https://x.y)",
        "**<iframe src=javascript:alert(1)>**",
        "<!-- c --><script>alert(1)</script>",
        "<div><p onclick=x>y</p></div>",
    ],
)
def test_html_in_every_construct_is_shown_as_text(source):
    output = render(source)
    assert markup_problems(output) == []
    assert "&lt;" in output or "&quot;" in output


def test_a_code_fence_language_is_kept_only_when_it_is_a_plain_name():
    assert compact(render("```python\nprint('<b>')\n```")) == (
        "<pre><code data-lang=\"python\">print('&lt;b&gt;')</code></pre>"
    )
    for source in [
        '```"><img src=x onerror=alert(1)>\nx\n```',
        "``` <script>\nx\n```",
        "~~~ja&quot;va\nx",
    ]:
        output = render(source)
        assert markup_problems(output) == [], source
        assert "data-lang" not in output, output
    assert 'data-lang="js"' in render("```js onload=alert(1)\nx\n```")


def test_an_unclosed_fence_of_a_streaming_answer_runs_to_the_end():
    assert compact(render("Here:\n```sh\nls -l\necho **hi**")) == (
        '<p>Here:</p><pre><code data-lang="sh">ls -l\necho **hi**</code></pre>'
    )


def test_headings_start_below_the_page_headings():
    assert (
        compact(render("# One\n## Two\n###### Six\nline"))
        == "<h3>One</h3><h4>Two</h4><h6>Six</h6><p>line</p>"
    )


def test_ordered_lists_keep_their_start_number():
    assert compact(render("3. three\n4. four")) == '<ol start="3"><li>three</li><li>four</li></ol>'
    assert compact(render("0. zero")) == '<ol start="0"><li>zero</li></ol>'
    assert render("1234567890. too many digits") == "<p>1234567890. too many digits</p>\n"


def test_nested_lists_nest():
    assert compact(render("- a\n  - b\n    - c\n- d\n\n1. one\n   - sub\n2. two")) == (
        "<ul><li>a<ul><li>b<ul><li>c</li></ul></li></ul></li><li>d</li></ul>"
        "<ol><li>one<ul><li>sub</li></ul></li><li>two</li></ol>"
    )


def test_tables_keep_alignment_escaped_pipes_and_ragged_rows():
    source = "| a | b | c |\n|:--|:-:|--:|\n| 1 | 2 \\| x | `3` |\n| only |\n| 1 | 2 | 3 | 4 |"
    output = render(source)
    assert markup_problems(output) == []
    assert "style" not in output  # the page's CSP allows no inline style
    assert compact(output) == (
        '<table><thead><tr><th class="align-left">a</th><th class="align-center">b</th>'
        '<th class="align-right">c</th></tr></thead>'
        '<tbody><tr><td class="align-left">1</td><td class="align-center">2 | x</td>'
        '<td class="align-right"><code>3</code></td></tr>'
        '<tr><td class="align-left">only</td><td class="align-center"></td>'
        '<td class="align-right"></td></tr>'
        '<tr><td class="align-left">1</td><td class="align-center">2</td>'
        '<td class="align-right">3</td></tr>'
        "</tbody></table>"
    )


def test_the_usual_subset_still_renders():
    cases = {
        "Use **Forgot password** now.": "<p>Use <strong>Forgot password</strong> now.</p>",
        "line one\nline two": "<p>line one<br>line two</p>",
        "a\n\nb": "<p>a</p><p>b</p>",
        "- *a*\n- `<b>`": "<ul><li><em>a</em></li><li><code>&lt;b&gt;</code></li></ul>",
        "> quoted\n> more": "<blockquote><p>quoted<br>more</p></blockquote>",
        "snake_case_name and 2 * 3": "<p>snake_case_name and 2 * 3</p>",
        "~~gone~~": "<p><s>gone</s></p>",
        "[docs](https://example.com/a?b=1&c=2)": (
            '<p><a href="https://example.com/a?b=1&amp;c=2" rel="noopener noreferrer" '
            'target="_blank">docs</a></p>'
        ),
        "see https://example.com/x.": (
            '<p>see <a href="https://example.com/x" rel="noopener noreferrer" '
            'target="_blank">https://example.com/x</a>.</p>'
        ),
    }
    for source, expected in cases.items():
        assert compact(render(source)) == expected, source


def test_every_hostile_and_random_input_gives_only_the_renderers_own_markup():
    sources = HOSTILE + random_sources(3000, seed=12)
    for source, result in zip(sources, render_all(sources), strict=True):
        assert markup_problems(result["html"]) == [], source


PATHOLOGICAL = {
    "brackets": "[" * 100_000,
    "link openers": "[a](" * 25_000,
    "backticks": "`" * 100_000,
    "alternating backticks": "` a " * 25_000,
    "stars": "*" * 100_000,
    "star words": "*a " * 33_000,
    "underscores": "_a" * 50_000,
    "tildes": "~~a" * 33_000,
    "angle brackets": "<" * 100_000,
    "autolinks": "<https://" * 11_000,
    "ampersands": "&#" * 50_000,
    "nested quotes": "> " * 50_000,
    "nested lists": "".join("  " * i + "- a\n" for i in range(300)),
    "list continuations": "- a\n" + "  $` https://e.com/$&\n" * 4_000,
    "table columns": "|"
    + "a|" * 5_000
    + "\n|"
    + "-|" * 5_000
    + "\n"
    + ("|" + "b|" * 5_000 + "\n") * 9,
    "table rows": "| a | b |\n|---|---|\n" + "| 1 | 2 |\n" * 10_000,
    "bare urls": "https://a.b/" * 8_000,
    "escapes": "\\" * 100_000,
    "fences": "```\n" * 25_000,
    "emphasis runs": "**a*" * 25_000,
    "html lookalikes": "<a href='" * 10_000,
}


def test_a_100_kb_pathological_input_renders_fast():
    # Catastrophic backtracking would take minutes here; a linear parser takes milliseconds.
    results = render_all(list(PATHOLOGICAL.values()))
    slow = {
        name: round(result["ms"])
        for name, result in zip(PATHOLOGICAL, results, strict=True)
        if result["ms"] > 2000
    }
    assert slow == {}
    for result in results:
        assert markup_problems(result["html"]) == []
