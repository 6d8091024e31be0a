"""The labelled set of `bench_pii`: questions in English and Chinese, with the personal data each
holds (type and value), and questions that hold none, among them the tricky ones (an order number
shaped like a mobile number, an 18-digit number whose check digit is wrong, a version, a price).

Built from templates and seeded random values, each value valid by its type's own rule (a PRC ID's
check digit, a card's Luhn sum, an IBAN's mod 97, a phone number its plan allows), and written to
benchmarks/pii_labelled/questions.jsonl, which the benchmark reads: the same set measures every
change of the detector. `manage.py bench_pii --write-set` writes it again from this file.

The templates are this project's, written beside the detector: a set from real traffic would find
what they miss. docs/security.md says so.
"""

from __future__ import annotations

import datetime
import random
import string
from collections.abc import Callable
from pathlib import Path

import phonenumbers

from benchmarks.labelled import rows_read, rows_write

SET = Path(__file__).resolve().parent / "pii_labelled" / "questions.jsonl"
SEED = 44
PER_TYPE = 40  # positive questions of each type, half English and half Chinese

_PROVINCES = "11 12 13 14 15 21 22 23 31 32 33 34 35 36 37 41 42 43 44 45 46 50 51 52 53 54".split()
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def _digits(rng: random.Random, count: int) -> str:
    return "".join(rng.choice(string.digits) for _ in range(count))


def cn_id(rng: random.Random) -> str:
    born = datetime.date(1940, 1, 1) + datetime.timedelta(days=rng.randrange(365 * 70))
    first = f"{rng.choice(_PROVINCES)}{_digits(rng, 4)}{born:%Y%m%d}{_digits(rng, 3)}"
    return first + "10X98765432"[sum(int(d) * w for d, w in zip(first, _ID_WEIGHTS)) % 11]


def _luhn_complete(body: str) -> str:
    for check in string.digits:
        total = 0
        for position, char in enumerate(reversed(body + check)):
            digit = int(char) * (2 if position % 2 else 1)
            total += digit - 9 if digit > 9 else digit
        if total % 10 == 0:
            return body + check
    raise AssertionError("a Luhn check digit always exists")


def bank_card(rng: random.Random) -> str:
    prefix, length = rng.choice([("4", 16), ("5", 16), ("62", 16), ("62", 19), ("37", 15)])
    if prefix == "5":
        prefix += rng.choice("12345")
    number = _luhn_complete(prefix + _digits(rng, length - len(prefix) - 1))
    if length == 16 and rng.random() < 0.5:
        return " ".join(number[i : i + 4] for i in range(0, 16, 4))
    return number


# The basic bank account number's shape of a few countries: letters (a) and digits (n).
_IBAN_SHAPES = {
    "DE": (("n", 18),),
    "GB": (("a", 4), ("n", 14)),
    "FR": (("n", 23),),
    "NL": (("a", 4), ("n", 10)),
    "ES": (("n", 20),),
}


def iban(rng: random.Random) -> str:
    country = rng.choice(sorted(_IBAN_SHAPES))
    bban = "".join(
        rng.choice(string.ascii_uppercase if kind == "a" else string.digits)
        for kind, count in _IBAN_SHAPES[country]
        for _ in range(count)
    )
    numeric = "".join(str(int(char, 36)) for char in bban + country + "00")
    compact = f"{country}{98 - int(numeric) % 97:02d}{bban}"
    if rng.random() < 0.5:
        return " ".join(compact[i : i + 4] for i in range(0, len(compact), 4))
    return compact


def cn_mobile(rng: random.Random) -> str:
    number = f"1{rng.choice('3456789')}{_digits(rng, 9)}"
    style = rng.randrange(3)
    if style == 0:
        return number
    if style == 1:
        return f"{number[:3]}-{number[3:7]}-{number[7:]}"
    return f"+86 {number[:3]} {number[3:7]} {number[7:]}"


def international_phone(rng: random.Random) -> str:
    while True:
        region = rng.choice(["GB", "US", "DE", "FR", "JP", "SG", "AU"])
        example = phonenumbers.example_number(region)
        assert example is not None
        national = str(example.national_number)
        candidate = phonenumbers.PhoneNumber(
            country_code=example.country_code,
            national_number=int(national[:-4] + _digits(rng, 4)),
        )
        if phonenumbers.is_valid_number(candidate):
            return phonenumbers.format_number(
                candidate, phonenumbers.PhoneNumberFormat.INTERNATIONAL
            )


def email(rng: random.Random) -> str:
    name = rng.choice(["li.wei", "zhang_san", "jane.doe", "m.rossi", "wang.fang88", "j.smith"])
    domain = rng.choice(["example.com", "mail.example.cn", "corp.example.org"])
    return f"{name}{rng.randrange(100)}@{domain}"


def passport(rng: random.Random) -> str:
    return rng.choice(["E", "G"]) + _digits(rng, 8)


def ip_address(rng: random.Random) -> str:
    if rng.random() < 0.75:
        first, last = rng.choice([n for n in range(11, 223) if n != 127]), rng.randrange(1, 255)
        return f"{first}.{rng.randrange(256)}.{rng.randrange(256)}.{last}"
    return (
        "2001:db8:"
        + ":".join(f"{rng.randrange(65536):x}" for _ in range(3))
        + "::"
        + f"{rng.randrange(1, 65536):x}"
    )


def secret(rng: random.Random) -> str:
    alphabet = string.ascii_letters + string.digits
    kind = rng.randrange(3)
    if kind == 0:
        return "sk-proj-" + "".join(rng.choice(alphabet) for _ in range(40))
    if kind == 1:
        return "ghp_" + "".join(rng.choice(alphabet) for _ in range(36))
    return "AKIA" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(16))


# type -> (value maker, English templates, Chinese templates); {v} is the value.
TEMPLATES: dict[str, tuple[Callable[[random.Random], str], list[str], list[str]]] = {
    "cn_id": (
        cn_id,
        [
            "My ID number is {v}, why was my claim refused?",
            "Check social insurance for {v} please",
            "{v} is my resident ID",
        ],
        [
            "我的身份证号是{v}，请帮我查一下社保",
            "身份证{v}办理了吗",
            "请核对证件号码 {v} 的信息",
            "{v}这个身份证能开户吗",
        ],
    ),
    "bank_card": (
        bank_card,
        [
            "My card {v} was charged twice",
            "Refund to {v} please",
            "why is {v} declined at checkout?",
        ],
        ["我的银行卡{v}被冻结了", "退款请打到 {v}", "卡号{v}为什么扣款两次", "{v} 这张卡还能用吗"],
    ),
    "iban": (
        iban,
        [
            "Please send the refund to IBAN {v}",
            "Is {v} the right account for the transfer?",
            "wire it to {v}",
        ],
        ["请退款到 {v}", "收款账户 {v} 对吗", "转账到{v}需要多久"],
    ),
    "phone": (
        lambda rng: cn_mobile(rng) if rng.random() < 0.6 else international_phone(rng),
        [
            "Call me back on {v}",
            "my phone is {v}, text me when it ships",
            "You can reach me at {v}",
        ],
        ["我的手机{v}，请回电", "联系电话：{v}", "请给 {v} 发短信", "号码{v}收不到验证码"],
    ),
    "email": (
        email,
        ["Send the invoice to {v}", "I never got the mail at {v}", "{v} is my login"],
        ["请发到邮箱{v}", "我的邮箱 {v} 收不到邮件", "账号{v}登录不了"],
    ),
    "passport": (
        passport,
        ["My passport number is {v}, can I check in online?", "passport {v} expires next month"],
        ["护照号码 {v} 过期了怎么办", "我的护照{v}能办签证吗"],
    ),
    "ip_address": (
        ip_address,
        ["Our server at {v} cannot reach the API", "Requests from {v} are blocked"],
        ["服务器 {v} 连不上接口", "来自{v}的请求被拦截了"],
    ),
    "secret": (
        secret,
        ["I pasted my key {v} by mistake, is it safe?", "why does {v} get 401?"],
        ["我的密钥{v}泄露了怎么办", "用 {v} 调用返回401"],
    ),
}


def _negatives(rng: random.Random) -> list[str]:
    """Questions that hold no personal data, many of them numbers that look like some."""
    out = [
        "What is the refund policy for orders over 30 days?",
        "How do I reset my password without my old phone?",
        "Which plans include priority support?",
        "退货政策是什么？",
        "会员等级怎么升级",
        "为什么我的订单还没有发货",
        "upgrade to version 1.2.3.4 failed",
        "the meeting is at 10:30:45 UTC",
        "it costs 1,234,567.89 yuan",
        "release 2024.05.01 broke the export",
        "E12345678 is the product model, where is the manual?",
        "SKU AB1234567 is out of stock",
    ]
    for _ in range(30):
        mobile_shaped = f"1{rng.choice('3456789')}{_digits(rng, 9)}"
        out.append(
            rng.choice(
                [
                    "订单号 {v} 什么时候发货",
                    "运单编号：{v}",
                    "my order {v} has not arrived",
                    "tracking {v} shows no update",
                ]
            ).format(v=mobile_shaped)
        )
    for _ in range(20):
        number = cn_id(rng)
        wrong = number[:17] + rng.choice([d for d in "0123456789X" if d != number[17]])
        out.append(rng.choice(["身份证{v}办理了吗", "ID {v} on the form"]).format(v=wrong))
    for _ in range(20):
        card = bank_card(rng).replace(" ", "")
        wrong = card[:-1] + str((int(card[-1]) + rng.randrange(1, 10)) % 10)
        out.append(rng.choice(["reference {v}", "卡号{v}为什么扣款两次"]).format(v=wrong))
    for _ in range(10):
        out.append(f"invoice no. {_digits(rng, 16)} is missing")
    return out


def build(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for kind, (make, english, chinese) in TEMPLATES.items():
        for n in range(PER_TYPE):
            lang, templates = ("en", english) if n % 2 == 0 else ("zh", chinese)
            value = make(rng)
            rows.append(
                {
                    "text": rng.choice(templates).format(v=value),
                    "lang": lang,
                    "findings": [{"type": kind, "value": value}],
                }
            )
    for text in _negatives(rng):
        lang = "zh" if any("\u4e00" <= char <= "\u9fff" for char in text) else "en"
        rows.append({"text": text, "lang": lang, "findings": []})
    return rows


def write(path: Path = SET) -> int:
    return rows_write(path, build())


def read(path: Path = SET) -> list[dict]:
    return rows_read(path)
