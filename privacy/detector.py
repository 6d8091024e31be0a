"""What personal data a text holds: typed findings with their spans and scores, offline, in
English and Chinese, in a small fraction of a millisecond per question.

Each type is a pattern and, where the type has one, its check: a PRC resident ID's check digit
and birth date, a bank card's Luhn sum and issuer prefix, an IBAN's mod-97 and its country's
length, an international phone number's numbering plan (Google's libphonenumber metadata, the
`phonenumbers` package), an IP address's parse. A candidate that fails its check is no finding:
a wrong finding keeps a question off a road it could take, so precision comes first, as for a
direct answer. Types without a check (a mainland mobile number, a passport) are scored by the
words around them: "order", "订单" lower a number's score below the threshold, "护照", "passport"
raise a passport-shaped token above it.

Measured before choosing (2026-12-07, this 2-core machine): Presidio's analyzer with a blank spaCy
pipeline and five of its pattern recognizers took 0.3 to 2.7 ms p50 per question, reached for the
public-suffix list over the network the first time its e-mail recognizer ran, and has no
recognizer for a PRC resident ID or a mainland mobile number; the types here are its checks and
patterns written for the questions this gateway gets (`docs/security.md`).

Spans are offsets into the text as given. Full-width digits and Latin letters (１３８, ＡＢ) are
read as their ASCII forms, which keeps every offset.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass

import phonenumbers

EMAIL = "email"
PHONE = "phone"
CN_ID = "cn_id"
BANK_CARD = "bank_card"
IBAN = "iban"
PASSPORT = "passport"
IP_ADDRESS = "ip_address"
SECRET = "secret"
# In the order a tie between two findings of one span is settled: the more specific first.
TYPES = (SECRET, CN_ID, IBAN, BANK_CARD, EMAIL, PHONE, PASSPORT, IP_ADDRESS)
CHECKSUMMED = frozenset({CN_ID, BANK_CARD, IBAN})
THRESHOLD = 0.5  # a finding counts from this score up, unless the settings say otherwise


@dataclass(frozen=True, slots=True)
class Finding:
    type: str
    start: int
    end: int
    score: float


# Full-width forms (U+FF01..U+FF5E) and the ideographic space, read as ASCII: one character for
# one, so every offset holds.
FOLD = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)} | {0x3000: 0x20}
# Digits and Latin letters end a token; a CJK character does not (`\b` would see none between
# 是 and 1, both being word characters).
_L = r"(?<![0-9A-Za-z])"
_R = r"(?![0-9A-Za-z])"
_CONTEXT_BEFORE, _CONTEXT_AFTER = 32, 12


def _near(lower: str, start: int, end: int, words: tuple[str, ...]) -> bool:
    window = lower[max(0, start - _CONTEXT_BEFORE) : end + _CONTEXT_AFTER]
    return any(word in window for word in words)


def _scored(
    lower: str, start: int, end: int, base: float, up: tuple[str, ...], down: tuple[str, ...]
) -> float:
    score = base
    if up and _near(lower, start, end, up):
        score += 0.2
    if down and _near(lower, start, end, down):
        score -= 0.5
    return round(max(0.0, min(1.0, score)), 2)


# An identifier of a thing, not of a person: an 11-digit order number looks like a mobile number.
_NOT_A_PERSON = (
    "order",
    "tracking",
    "invoice",
    "serial",
    "sku",
    "ticket",
    "订单",
    "单号",
    "运单",
    "快递",
    "发票",
    "流水",
    "编号",
    "工单",
    "批号",
)


# --- e-mail ---------------------------------------------------------------------------------------

_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![A-Za-z0-9-])"
)


def _emails(text: str, lower: str) -> Iterator[Finding]:
    for match in _EMAIL.finditer(text):
        yield Finding(EMAIL, match.start(), match.end(), 1.0)


# --- PRC resident ID ------------------------------------------------------------------------------

_CN_ID = re.compile(_L + r"\d{17}[\dXx]" + _R)
_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CN_ID_CHECK = "10X98765432"
# The provinces' codes, the first two digits (GB/T 2260).
_CN_PROVINCES = frozenset(
    "11 12 13 14 15 21 22 23 31 32 33 34 35 36 37 41 42 43 44 45 46 50 51 52 53 54 "
    "61 62 63 64 65 71 81 82 83 91".split()
)


def cn_id_valid(number: str) -> bool:
    """An 18-character PRC resident ID: a province, a real birth date and its check digit."""
    if len(number) != 18 or number[:2] not in _CN_PROVINCES:
        return False
    try:
        born = datetime.date(int(number[6:10]), int(number[10:12]), int(number[12:14]))
    except ValueError:
        return False
    if born.year < 1900:
        return False
    total = sum(int(digit) * weight for digit, weight in zip(number, _CN_ID_WEIGHTS))
    return _CN_ID_CHECK[total % 11] == number[17].upper()


def _cn_ids(text: str, lower: str) -> Iterator[Finding]:
    for match in _CN_ID.finditer(text):
        if cn_id_valid(match.group()):
            yield Finding(CN_ID, match.start(), match.end(), 1.0)


# --- bank cards -----------------------------------------------------------------------------------

# 13 to 19 digits, bare or in groups of 3 to 6 split by one space or dash.
_CARD = re.compile(_L + r"(?:\d{13,19}|\d{3,6}(?:[ -]\d{3,6}){2,5})" + _R)
_CARD_WORDS = ("card", "visa", "mastercard", "credit", "debit", "卡", "银联", "信用", "储蓄")


def luhn_valid(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        digit = int(char)
        if position % 2:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


def _issuer_plausible(digits: str) -> bool:
    """A prefix and length some card network issues (Visa, Mastercard, Amex, UnionPay, JCB,
    Discover, Diners, Maestro)."""
    length, two = len(digits), int(digits[:2])
    if digits[0] == "4":
        return length in (13, 16, 19)
    if 51 <= two <= 55 or 2221 <= int(digits[:4]) <= 2720:
        return length == 16
    if two in (34, 37):
        return length == 15
    if two in (62, 35, 60, 64, 65, 81):
        return 16 <= length <= 19
    if two in (30, 36, 38, 39):
        return 14 <= length <= 19
    if two in (50, 56, 57, 58, 63, 67):
        return 12 <= length <= 19
    return False


def _bank_cards(text: str, lower: str) -> Iterator[Finding]:
    for match in _CARD.finditer(text):
        digits = re.sub(r"[ -]", "", match.group())
        if not 13 <= len(digits) <= 19 or len(set(digits)) == 1:
            continue
        if luhn_valid(digits) and _issuer_plausible(digits):
            score = _scored(lower, match.start(), match.end(), 0.8, _CARD_WORDS, _NOT_A_PERSON)
            yield Finding(BANK_CARD, match.start(), match.end(), score)


# --- IBAN -----------------------------------------------------------------------------------------

_IBAN = re.compile(_L + r"[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?" + _R)
# The lengths of the countries that issue most IBANs (the registry's; others: 15 to 34).
_IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AT": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29, "CH": 21, "CY": 28,
    "CZ": 24, "DE": 22, "DK": 18, "EE": 20, "ES": 24, "FI": 18, "FR": 27, "GB": 22, "GR": 27,
    "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "KW": 30, "KZ": 20, "LI": 21,
    "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MT": 31, "NL": 18, "NO": 15, "PL": 28, "PT": 25,
    "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SE": 24, "SI": 19, "SK": 24, "TR": 26, "UA": 29,
}  # fmt: skip


def iban_valid(iban: str) -> bool:
    compact = iban.replace(" ", "")
    expected = _IBAN_LENGTHS.get(compact[:2])
    if not (len(compact) == expected if expected else 15 <= len(compact) <= 34):
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97 == 1


def _ibans(text: str, lower: str) -> Iterator[Finding]:
    for match in _IBAN.finditer(text):
        if iban_valid(match.group()):
            yield Finding(IBAN, match.start(), match.end(), 1.0)


# --- phones ---------------------------------------------------------------------------------------

# A mainland mobile number: 1, a network digit 3-9, nine more; +86 or 0086 optional.
_CN_MOBILE = re.compile(r"(?<![0-9A-Za-z+])(?:(?:\+|00)86[ -]?)?1[3-9]\d[ -]?\d{4}[ -]?\d{4}" + _R)
# An international number: + and 8 to 15 digits, with the usual separators.
_INTERNATIONAL = re.compile(r"(?<![0-9A-Za-z+])\+[1-9](?:[ ().-]?\d){6,16}" + _R)
_PHONE_WORDS = (
    "phone",
    "mobile",
    "call",
    "tel",
    "sms",
    "whatsapp",
    "wechat",
    "text me",
    "电话",
    "手机",
    "联系",
    "号码",
    "微信",
    "短信",
    "致电",
)


def _phones(text: str, lower: str) -> Iterator[Finding]:
    for match in _CN_MOBILE.finditer(text):
        prefixed = match.group()[0] in "+0"
        base = 0.9 if prefixed else 0.7
        score = _scored(lower, match.start(), match.end(), base, _PHONE_WORDS, _NOT_A_PERSON)
        yield Finding(PHONE, match.start(), match.end(), score)
    for match in _INTERNATIONAL.finditer(text):
        try:
            number = phonenumbers.parse(match.group(), None)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            score = _scored(lower, match.start(), match.end(), 0.8, _PHONE_WORDS, _NOT_A_PERSON)
            yield Finding(PHONE, match.start(), match.end(), score)


# --- passports ------------------------------------------------------------------------------------

# A PRC passport (E, G, D, S or P and 8 digits; E, a letter and 7 digits), and the shape most
# others have: one or two letters and 6 to 8 digits. Neither is a passport without the word.
_PASSPORT_CN = re.compile(_L + r"(?:[EGDSP]\d{8}|E[A-HJ-NP-Z]\d{7})" + _R)
_PASSPORT_OTHER = re.compile(_L + r"[A-Z]{1,2}\d{6,8}" + _R)
_PASSPORT_WORDS = ("passport", "护照", "travel document", "旅行证件")


def _passports(text: str, lower: str) -> Iterator[Finding]:
    seen = set()
    for pattern, base in ((_PASSPORT_CN, 0.4), (_PASSPORT_OTHER, 0.3)):
        for match in pattern.finditer(text):
            if match.start() in seen:
                continue
            seen.add(match.start())
            score = base + (
                0.55 if _near(lower, match.start(), match.end(), _PASSPORT_WORDS) else 0
            )
            yield Finding(PASSPORT, match.start(), match.end(), round(min(score, 1.0), 2))


# --- IP addresses ---------------------------------------------------------------------------------

_IPV4 = re.compile(r"(?<![0-9A-Za-z.])(?:\d{1,3}\.){3}\d{1,3}(?![0-9A-Za-z]|\.\d)")
_IPV6 = re.compile(r"(?<![0-9A-Za-z:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![0-9A-Za-z:])")
_VERSION_WORDS = ("version", "release", "版本")


def _ip_addresses(text: str, lower: str) -> Iterator[Finding]:
    for match in _IPV4.finditer(text):
        try:
            address = ipaddress.IPv4Address(match.group())
        except ValueError:
            continue
        if not _a_host(address):
            continue
        score = 0.4 if _near(lower, match.start(), match.end(), _VERSION_WORDS) else 0.9
        yield Finding(IP_ADDRESS, match.start(), match.end(), score)
    for match in _IPV6.finditer(text):
        candidate = match.group()
        if candidate.count(":") < 2 or not any(c not in ":0" for c in candidate):
            continue
        try:
            address6 = ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        if _a_host(address6):
            yield Finding(IP_ADDRESS, match.start(), match.end(), 0.9)


def _a_host(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """An address that may be someone's machine: not this one (loopback), not "any", not a
    multicast group, a link-local or a reserved block."""
    return not (
        address.is_loopback
        or address.is_unspecified
        or address.is_multicast
        or address.is_link_local
        or address.is_reserved
    )


# --- keys and secrets -----------------------------------------------------------------------------

_SECRET = re.compile(
    "|".join(
        (
            r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----"
            r"(?:[\s\S]*?-----END (?:[A-Z]+ )*PRIVATE KEY-----)?",
            _L + r"sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}",  # OpenAI, Anthropic
            _L + r"gw_[0-9a-f]{8}_[A-Za-z0-9_-]{40,}",  # this gateway's own API keys
            _L + r"gh[pousr]_[A-Za-z0-9]{36,}",  # GitHub
            _L + r"github_pat_[A-Za-z0-9_]{22,}",
            _L + r"(?:AKIA|ASIA)[0-9A-Z]{16}" + _R,  # AWS access key ids
            _L + r"xox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
            _L + r"AIza[0-9A-Za-z_-]{35}",  # Google
            _L + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # a JWT
        )
    )
)


def _secrets(text: str, lower: str) -> Iterator[Finding]:
    for match in _SECRET.finditer(text):
        yield Finding(SECRET, match.start(), match.end(), 1.0)


_RECOGNIZERS: dict[str, Callable[[str, str], Iterator[Finding]]] = {
    SECRET: _secrets,
    CN_ID: _cn_ids,
    IBAN: _ibans,
    BANK_CARD: _bank_cards,
    EMAIL: _emails,
    PHONE: _phones,
    PASSPORT: _passports,
    IP_ADDRESS: _ip_addresses,
}
_RANK = {kind: rank for rank, kind in enumerate(TYPES)}


# What every finding holds at least one of: a digit, an @, a key's prefix. A text without any (most
# Chinese prose, most English without numbers) is answered without running a recognizer. (An
# IPv6 address with no digit at all, `fe::ab`, is the one finding this lets pass.)
_MAYBE = re.compile(r"[0-9\uff10-\uff19@]|sk-|gh[pousr]_|github_pat_|xox[abposr]-|AIza|eyJ|BEGIN ")


_ALL = frozenset(TYPES)
_SEEN_MAX = 4096
# Under each policy (its types and thresholds: the routing's, the curators' defaults), a text's
# digest -> its types; a memo is emptied when full, and all of them when a fifth policy comes.
_seen: dict[tuple, dict[bytes, frozenset[str]]] = {}


def types_in(
    text: str,
    *,
    types: Collection[str] | None = None,
    thresholds: Mapping[str, float] | None = None,
) -> frozenset[str]:
    """The types `detect` finds in `text` (with these types and thresholds), remembered by the
    text's digest: a conversation's earlier messages are read once, not at every turn."""
    if not _MAYBE.search(text):
        return frozenset()
    under = (_ALL if types is None else frozenset(types), tuple(sorted((thresholds or {}).items())))
    seen = _seen.get(under)
    if seen is None:
        if len(_seen) >= 4:
            _seen.clear()
        seen = _seen[under] = {}
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    found = seen.get(digest)
    if found is None:
        found = frozenset(f.type for f in detect(text, types=types, thresholds=thresholds))
        if len(seen) >= _SEEN_MAX:
            seen.clear()  # one step, safe beside another thread's look
        seen[digest] = found
    return found


def detect(
    text: str,
    *,
    types: Collection[str] | None = None,
    thresholds: Mapping[str, float] | None = None,
) -> list[Finding]:
    """The findings in `text`, in order, none overlapping another: of `types` (default every
    one), each scored at least its threshold (`thresholds`, default THRESHOLD). Where two
    overlap, the higher score stays, then the longer span, then the more specific type."""
    folded = text.translate(FOLD)
    lower = folded.lower()
    limits = thresholds or {}
    found = [
        finding
        for kind, recognize in _RECOGNIZERS.items()
        if types is None or kind in types
        for finding in recognize(folded, lower)
        if finding.score >= limits.get(kind, THRESHOLD)
    ]
    if len(found) < 2:
        return found
    found.sort(key=lambda f: (-f.score, f.start - f.end, _RANK[f.type], f.start))
    kept: list[Finding] = []
    for finding in found:
        if all(finding.end <= other.start or other.end <= finding.start for other in kept):
            kept.append(finding)
    return sorted(kept, key=lambda f: f.start)
