"""`POST /v1/completions` through the real gateway (daphne) to engines over real HTTP: the
simulator (vLLM's completions, in echo mode) and an engine that records what it receives. The
clients are the official SDK, streamed and not, and LangChain's completion model: what a
code-completion tool or a RAG pipeline calling the legacy API sees."""

import json
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from chat.apikeys import apikey_create
from chat.models import ApiKey
from inference_ops import openai_fields
from observability.models import RequestLog
from routing.models import RoutingRule
from spend.models import Limit
from tests.spend.test_limits import same_minute
from tests.support.factories import endpoint, rule
from tests.support.polling import wait_until
from tests.support.stub_engine import COMPLETION_TEXT, COMPLETION_USAGE, ApisRecorder

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "The lighthouse keeper climbed the stairs and"
KINDS = ("vllm", "cpu", "external")
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
# A valid value of every field the gateway passes on (or sends to some kinds only).
SAMPLES = {
    "temperature": 0.3,
    "top_p": 0.9,
    "stop": ["\n\n", "END"],
    "seed": 7,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "logit_bias": {"50256": -100},
    "logprobs": 2,
    "user": "customer-42",
    "n": 2,
    "echo": True,
    "suffix": "}",
    "best_of": 2,
    "use_beam_search": False,
    "length_penalty": 1.0,
    "repetition_penalty": 1.1,
    "repetition_detection": {"max_pattern_size": 8},
    "watermarking": False,
    "stop_token_ids": [1, 2],
    "include_stop_str_in_output": True,
    "min_tokens": 1,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 100,
    "truncation_side": "left",
    "allowed_token_ids": [5, 6, 7],
    "prompt_logprobs": 1,
    "logprob_token_ids": [1, 2],
    "bad_words": ["darn"],
    "add_special_tokens": False,
    "response_format": {"type": "json_object"},
    "structured_outputs": {"json": SCHEMA},
    "session_id": "conversation-1",
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
    "routed_experts_prompt_start": 0,
    "thinking_token_budget": 64,
    "stream_interval": 2,
    "cache_salt": "tenant-salt",
    "top_k": 20,
    "min_p": 0.05,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def recorder():
    engine = ApisRecorder().start()
    yield engine
    engine.stop()


@pytest.fixture
def targets(recorder):
    """One endpoint of each kind, all on the recording engine, listed by the default rule."""
    made = {
        kind: endpoint(f"rec-{kind}", url=f"{recorder.url}/v1", kind=kind, model="served-name")
        for kind in KINDS
    }
    rule("default", *made.values(), is_default=True, use_kb_context=False)
    recorder.received.clear()
    return made


@pytest.fixture
def local(local_sim):
    """The default rule's one target: the simulator, which serves chat and completions."""
    made = endpoint("local", local_sim)
    rule("default", made, is_default=True, use_kb_context=False)
    return made


def sdk(asgi_server, key) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=key, max_retries=0, timeout=30)


def post(asgi_server, key, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{asgi_server}/v1/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def logged(key: str, count=1) -> list[RequestLog]:
    """The key's rows once `count` are in: the server writes them in batches behind the answers
    (an earlier test's may land late; they are another key's)."""
    rows = RequestLog.objects.filter(api_key_id=key_row(key).pk).order_by("at", "id")
    wait_until(lambda: rows.count() >= count, timeout=10)
    return list(rows)


def key_row(raw: str) -> ApiKey:
    return ApiKey.objects.get(prefix=raw.split("_")[1])


# --- the answer -----------------------------------------------------------------------------------


def test_the_sdk_gets_a_completion_of_its_prompt_with_its_usage(asgi_server, alice_key, local):
    raw = sdk(asgi_server, alice_key).completions.with_raw_response.create(
        model="auto", prompt=PROMPT, max_tokens=4
    )
    completion = raw.parse()
    (choice,) = completion.choices
    # The simulator in echo mode repeats the prompt: the completion is the prompt's first words.
    assert choice.text.split() == PROMPT.split()[:4] and choice.finish_reason == "length"
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    assert completion.model == "auto:local"
    assert completion.usage.completion_tokens == 4 and completion.usage.prompt_tokens > 0
    assert raw.headers["X-Route"] == "local" and raw.headers["X-Route-Target"] == "local"


def test_the_sdk_streams_a_completion_chunk_by_chunk_then_its_usage(asgi_server, alice_key, local):
    client = sdk(asgi_server, alice_key)
    whole = client.completions.create(model="local", prompt=PROMPT, max_tokens=6)
    chunks = list(
        client.completions.create(
            model="local",
            prompt=PROMPT,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert len(texts) > 1 and "".join(texts) == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].model == "local"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


@pytest.mark.parametrize("streamed", [False, True])
def test_several_choices_with_logprobs_come_back_each_with_its_index(
    asgi_server, alice_key, local, streamed
):
    client = sdk(asgi_server, alice_key)
    asked = dict(model="auto", prompt=PROMPT, max_tokens=3, n=2, logprobs=1)
    if streamed:
        texts, tokens, finishes = {0: "", 1: ""}, {0: [], 1: []}, {}
        for chunk in client.completions.create(**asked, stream=True):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
                if choice.logprobs:
                    tokens[choice.index] += choice.logprobs.tokens
                if choice.finish_reason:
                    finishes[choice.index] = choice.finish_reason
    else:
        completion = client.completions.create(**asked)
        texts = {c.index: c.text for c in completion.choices}
        tokens = {c.index: c.logprobs.tokens for c in completion.choices}
        finishes = {c.index: c.finish_reason for c in completion.choices}
    assert set(texts) == {0, 1} and all(texts.values())
    assert {index: "".join(found) for index, found in tokens.items()} == texts
    assert finishes == {0: "length", 1: "length"}


def test_a_prompt_of_token_ids_is_completed(asgi_server, alice_key, local):
    completion = sdk(asgi_server, alice_key).completions.create(
        model="auto", prompt=[101, 2023, 2003], max_tokens=2
    )
    assert completion.choices[0].text and completion.usage.prompt_tokens == 3


def test_langchains_completion_model_completes_a_prompt(asgi_server, alice_key, local):
    from langchain_openai import OpenAI

    llm = OpenAI(
        base_url=f"{asgi_server}/v1",
        api_key=alice_key,
        model="auto",
        max_tokens=3,
        max_retries=0,
        timeout=30,
    )
    assert llm.invoke(PROMPT).split() == PROMPT.split()[:3]


# --- the fields -----------------------------------------------------------------------------------


def test_the_clients_fields_reach_the_engine_as_sent_with_the_prompt_and_nothing_added(
    asgi_server, alice_key, recorder
):
    made = endpoint("rec", url=f"{recorder.url}/v1", kind="vllm", model="served-name")
    rule("default", made, is_default=True, use_kb_context=False, system_prompt="Be brief.")
    recorder.received.clear()
    fields = {
        "echo": True,
        "seed": 7,
        "stop": ["\n\n"],
        "user": "customer-42",
        "logprobs": 2,
        "temperature": 0.2,
        "top_k": 5,
        "repetition_penalty": 1.1,
        "return_token_ids": True,
    }
    completion = sdk(asgi_server, alice_key).completions.create(
        model="auto", prompt=[PROMPT], max_tokens=20, extra_body=fields
    )
    assert completion.choices[0].text == COMPLETION_TEXT
    assert completion.usage.total_tokens == COMPLETION_USAGE["total_tokens"]
    (sent,) = recorder.received
    # The prompt as sent: no system prompt, no passages; the model is the target's served name.
    assert sent["prompt"] == [PROMPT] and sent["model"] == "served-name"
    assert {name: sent[name] for name in fields} == fields
    assert sent["max_tokens"] == 20
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_the_rules_token_ceiling_caps_max_tokens(asgi_server, alice_key, recorder):
    made = endpoint("rec", url=f"{recorder.url}/v1", kind="vllm", model="served-name")
    rule("default", made, is_default=True, use_kb_context=False, max_tokens=50)
    recorder.received.clear()
    client = sdk(asgi_server, alice_key)
    client.completions.create(model="auto", prompt=PROMPT, max_tokens=5000)
    client.completions.create(model="auto", prompt=PROMPT)
    assert [sent["max_tokens"] for sent in recorder.received] == [50, 50]


def test_the_samples_cover_every_field_the_gateway_passes_on():
    assert set(SAMPLES) == set(openai_fields.COMPLETION_TAKES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_field_reaches_the_engines_that_take_it_as_sent_and_is_refused_by_name_elsewhere(
    asgi_server, alice_key, targets, recorder, name
):
    value = SAMPLES[name]
    takes = openai_fields.kinds_taking(name, value, openai_fields.COMPLETIONS)
    for kind in KINDS:
        recorder.received.clear()
        status, body = post(
            asgi_server, alice_key, {"model": f"rec-{kind}", "prompt": PROMPT, name: value}
        )
        if kind in takes:
            assert status == 200, body
            (sent,) = recorder.received
            assert sent[name] == value, (kind, sent)
        else:
            assert status == 400, body
            error = body["error"]
            assert error["param"] == name and error["code"] == "unsupported_parameter"
            assert f"`{name}`" in error["message"] and f"rec-{kind}" in error["message"]
            assert recorder.received == []  # never sent to be ignored


@pytest.mark.parametrize("name", sorted(openai_fields.COMPLETION_REFUSED))
def test_a_field_that_is_the_operators_is_refused_by_name(
    asgi_server, alice_key, targets, recorder, name
):
    status, body = post(asgi_server, alice_key, {"model": "auto", "prompt": PROMPT, name: 1})
    assert status == 400 and body["error"]["param"] == name
    assert body["error"]["code"] == "unsupported_parameter" and recorder.received == []


def test_auto_passes_over_a_target_that_takes_no_field_of_the_request(
    asgi_server, alice_key, recorder
):
    external = endpoint("rec-external", url=f"{recorder.url}/v1", kind="external", model="m")
    local = endpoint("rec-vllm", url=f"{recorder.url}/v1", kind="vllm", model="m")
    rule("default", external, local, is_default=True, use_kb_context=False)
    recorder.received.clear()
    status, body = post(asgi_server, alice_key, {"model": "auto", "prompt": PROMPT, "top_k": 5})
    assert status == 200 and body["model"] == "auto:rec-vllm"
    assert [sent["top_k"] for sent in recorder.received] == [5]
    # What no target of the rule takes together: a 400 naming a field, nothing sent.
    recorder.received.clear()
    status, body = post(
        asgi_server, alice_key, {"model": "auto", "prompt": PROMPT, "top_k": 5, "best_of": 2}
    )
    assert status == 400 and body["error"]["param"] in ("top_k", "best_of")
    assert recorder.received == []


def test_the_docs_table_says_each_fields_policy_as_the_code_does():
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    table = text.split("<!-- completion-fields:start -->")[1]
    table = table.split("<!-- completion-fields:end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        name, policy, vllm, cpu, external = (cell.strip() for cell in line.strip("|").split("|"))
        rows[name.strip("`")] = (policy, {"vllm": vllm, "cpu": cpu, "external": external})
    assert set(rows) == set(openai_fields.COMPLETION_KNOWN)
    for name, (policy, marks) in rows.items():
        if name in openai_fields.COMPLETION_REFUSED:
            assert policy.startswith("refused") and set(marks.values()) == {"400"}, name
        elif name in openai_fields.COMPLETION_GATEWAY:
            assert policy.startswith("the gateway's") and set(marks.values()) == {"✓"}, name
        else:
            takes = openai_fields.kinds_taking(name, SAMPLES[name], openai_fields.COMPLETIONS)
            assert marks == {kind: "✓" if kind in takes else "400" for kind in KINDS}, name


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "auto"}, "prompt", None),
        ({"model": "auto", "prompt": ""}, "prompt", None),
        ({"model": "auto", "prompt": []}, "prompt", None),
        ({"model": "auto", "prompt": ["one", "two"]}, "prompt", None),
        ({"model": "auto", "prompt": [1, -2]}, "prompt", None),
        ({"model": "auto", "prompt": "nul\x00"}, "prompt", "invalid_text"),
        ({"prompt": PROMPT}, "model", None),
        ({"model": "auto", "prompt": PROMPT, "temperature": 3}, "temperature", None),
        ({"model": "auto", "prompt": PROMPT, "n": 0}, "n", None),
        ({"model": "auto", "prompt": PROMPT, "logprobs": True}, "logprobs", None),
        ({"model": "auto", "prompt": PROMPT, "max_tokens": "5"}, "max_tokens", None),
        (
            {"model": "auto", "prompt": PROMPT, "stream_options": {"include_usage": True}},
            "stream_options",
            None,
        ),
        ({"model": "auto", "prompt": PROMPT, "priority": 5}, "priority", "unsupported_parameter"),
        ({"model": "auto", "prompt": PROMPT, "tempreature": 1}, "tempreature", "unknown_parameter"),
        ({"model": "auto", "prompt": PROMPT, "messages": []}, "messages", "unknown_parameter"),
    ],
)
def test_bad_input_is_a_400_that_names_the_field(asgi_server, alice_key, local, body, param, code):
    status, reply = post(asgi_server, alice_key, body)
    assert status == 400, reply
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error"
    if code is not None:
        assert reply["error"]["code"] == code


def test_a_prompt_over_the_size_limit_is_refused(asgi_server, alice_key, local):
    status, reply = post(asgi_server, alice_key, {"model": "auto", "prompt": "word " * 7000})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert reply["error"]["param"] == "prompt" and "the limit is 32000" in reply["error"]["message"]


def test_a_body_that_is_not_json_is_a_400(asgi_server, alice_key, local):
    request = urllib.request.Request(
        f"{asgi_server}/v1/completions",
        data=b"{nope",
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {alice_key}"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400
    assert json.loads(caught.value.read())["error"]["type"] == "invalid_request_error"


# --- routing --------------------------------------------------------------------------------------


def test_a_named_endpoint_the_rule_does_not_list_is_a_403(
    asgi_server, alice_key, local, external_sim
):
    endpoint("unlisted", external_sim, kind="external")
    with pytest.raises(openai.PermissionDeniedError) as caught:
        sdk(asgi_server, alice_key).completions.create(model="unlisted", prompt=PROMPT)
    assert caught.value.body["code"] == "model_not_allowed"
    assert "does not list 'unlisted'" in caught.value.body["message"]


def test_an_unknown_model_is_a_404(asgi_server, alice_key, local):
    with pytest.raises(openai.NotFoundError) as caught:
        sdk(asgi_server, alice_key).completions.create(model="nope", prompt=PROMPT)
    assert caught.value.body["code"] == "model_not_found"


def test_auto_passes_over_an_endpoint_that_serves_chat_only(
    asgi_server, alice_key, local_sim, external_sim
):
    chat_only = endpoint("chat-only", local_sim, apis=["chat"])
    external = endpoint("external", external_sim, kind="external")
    rule("default", chat_only, external, is_default=True, use_kb_context=False)
    client = sdk(asgi_server, alice_key)
    raw = client.completions.with_raw_response.create(model="auto", prompt=PROMPT, max_tokens=3)
    assert raw.parse().model == "auto:external" and raw.headers["X-Route-Target"] == "external"
    # Named, it is a 400 that says what it serves; chat still goes to it.
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="chat-only", prompt=PROMPT)
    assert caught.value.body["code"] == "unsupported_api" and caught.value.body["param"] == "model"
    assert "chat-only serves chat, not completions" in caught.value.body["message"]
    answer = client.chat.completions.create(
        model="chat-only", messages=[{"role": "user", "content": "hello"}], max_tokens=2
    )
    assert answer.choices[0].message.content


def test_it_falls_back_to_the_next_target_when_the_first_is_down(
    asgi_server, alice_key, external_sim
):
    down = endpoint("down", url="http://127.0.0.1:1/v1")
    external = endpoint("external", external_sim, kind="external")
    rule("default", down, external, is_default=True, use_kb_context=False)
    raw = sdk(asgi_server, alice_key).completions.with_raw_response.create(
        model="auto", prompt=PROMPT, max_tokens=3
    )
    assert raw.headers["X-Route-Target"] == "external" and raw.parse().choices[0].text
    [row] = logged(alice_key)
    assert (row.api, row.target, row.fallbacks) == ("completions", "external", 1)


def test_when_no_target_can_answer_the_client_gets_a_503(asgi_server, alice_key):
    down = endpoint("down", url="http://127.0.0.1:1/v1")
    rule("default", down, is_default=True, use_kb_context=False)
    with pytest.raises(openai.InternalServerError) as caught:
        sdk(asgi_server, alice_key).completions.create(model="auto", prompt=PROMPT)
    assert caught.value.status_code == 503 and caught.value.body["code"] == "connect"
    assert caught.value.body["message"] == "No model could answer this question right now."


def test_a_kb_only_rule_answers_no_completion(asgi_server, alice_key, local):
    rule("faq", keywords=["lighthouse"], action=RoutingRule.Action.KB_ONLY, priority=1)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        sdk(asgi_server, alice_key).completions.create(model="auto", prompt=PROMPT)
    assert caught.value.body["code"] == "model_not_allowed"


# --- keys, limits, the log ------------------------------------------------------------------------


def test_a_key_without_the_chat_scope_is_refused(asgi_server, django_user_model, local):
    staff = django_user_model.objects.create_user("curator", password="pw-123456789", is_staff=True)
    raw = apikey_create(user=staff, name="curation", scopes=["kb"])[1]
    with pytest.raises(openai.PermissionDeniedError) as caught:
        sdk(asgi_server, raw).completions.create(model="auto", prompt=PROMPT)
    assert caught.value.body["code"] == "insufficient_scope"


def test_a_spend_limit_refuses_with_a_429_and_when_to_come_back(asgi_server, alice_key, local):
    Limit.objects.create(api_key=key_row(alice_key), requests_per_minute=1)
    same_minute()
    client = sdk(asgi_server, alice_key)
    first = client.completions.with_raw_response.create(model="auto", prompt=PROMPT, max_tokens=2)
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as caught:
        client.completions.create(model="auto", prompt=PROMPT, max_tokens=2)
    assert caught.value.body["code"] == "rate_limit_exceeded"
    assert 1 <= int(caught.value.response.headers["Retry-After"]) <= 60


def test_the_request_log_keeps_a_row_with_its_api_tokens_and_route(
    asgi_server, alice, alice_key, local
):
    completion = sdk(asgi_server, alice_key).completions.create(
        model="auto", prompt=PROMPT, max_tokens=4
    )
    [row] = logged(alice_key)
    assert (row.interface, row.api, row.user_id, row.road, row.target, row.status) == (
        "v1",
        "completions",
        alice.pk,
        "local",
        "local",
        "complete",
    )
    assert row.prompt_tokens == completion.usage.prompt_tokens and row.completion_tokens == 4
    assert row.ttft_ms is not None and row.kb_method == "" and row.session_id is None
