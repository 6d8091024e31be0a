"""The KB benchmark behind `manage.py bench_kb`: a synthetic KB, query sets and timing helpers.

The KB is combinatorial (products x intents x editions), so any size up to 43,200
FAQ entries comes out the same every time and a re-run recognises a KB it built
earlier. Query sets are built so that no string is
asked twice in timed runs: the query-embedding LRU must not flatter the figures.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.db import connection, connections, transaction

from knowledge.embeddings import embed_texts, query_cache
from knowledge.models import EmbeddingModel, Entry, Passage, Phrasing
from knowledge.normalize import normalize
from knowledge.selectors import _nearest, direct_answer, faq_matches
from knowledge.services import entry_validate, split_passages

# --- the synthetic KB ---------------------------------------------------------------------------

PRODUCTS = """
smartphone, tablet, laptop, desktop computer, smartwatch, fitness tracker, wireless earbuds,
over-ear headphones, Bluetooth speaker, soundbar, smart TV, home projector, streaming stick,
game console, VR headset, e-reader, digital camera, action camera, dashcam, camera drone,
baby monitor, video doorbell, security camera, smart lock, smart thermostat, smoke detector,
Wi-Fi router, mesh Wi-Fi system, network switch, NAS drive, external hard drive, USB flash drive,
portable SSD, inkjet printer, laser printer, 3D printer, document scanner, label printer,
computer monitor, mechanical keyboard, wireless mouse, webcam, USB microphone, graphics tablet,
docking station, power bank, wireless charger, electric toothbrush, water flosser, electric shaver,
hair dryer, hair straightener, curling iron, beard trimmer, bathroom scale, blood pressure monitor,
digital thermometer, massage gun, robot vacuum, cordless vacuum, carpet cleaner, steam mop,
air purifier, dehumidifier, humidifier, space heater, tower fan, ceiling fan,
portable air conditioner, window air conditioner, heat pump, water heater, dishwasher,
washing machine, tumble dryer, refrigerator, chest freezer, wine cooler, microwave oven,
built-in oven, induction hob, range hood, air fryer, slow cooker, pressure cooker, rice cooker,
bread maker, stand mixer, hand blender, countertop blender, food processor, juicer,
espresso machine, drip coffee maker, coffee grinder, milk frother, electric kettle, toaster,
sandwich maker, waffle maker, sous vide cooker, ice cream maker, water dispenser, soda maker,
electric grill, pizza oven, pellet grill, lawn mower, robot lawn mower, leaf blower,
hedge trimmer, chainsaw, pressure washer, irrigation controller, pool cleaning robot,
electric bike, electric scooter, hoverboard, electric skateboard, car battery charger,
jump starter, tire inflator, car stereo, GPS navigator, walkie-talkie, cordless phone,
smart speaker, smart display, smart plug, smart light bulb, LED light strip, motion sensor,
garage door opener, electric blanket, heated mattress pad, sewing machine, embroidery machine,
label maker, paper shredder, laminator, graphing calculator, digital piano, guitar amplifier,
DJ controller, turntable, AV receiver, subwoofer, CD player, DAB radio, bottle warmer,
breast pump, white noise machine, aquarium heater, automatic pet feeder, pet camera,
GPS pet tracker, self-cleaning litter box, treadmill, exercise bike, rowing machine,
elliptical trainer, heart rate monitor, cycling computer, golf rangefinder, fish finder,
metal detector, smart telescope, digital microscope, portable power station, solar panel kit,
inverter generator, uninterruptible power supply, surge protector, home EV charger,
intercom system, home alarm system, water leak sensor, carbon monoxide detector,
motorised blinds, window cleaning robot, electric fireplace, heated towel rail, water softener,
water filter system, ice maker, chest massager, foot spa, facial steamer, electric nail file,
label embosser, barcode scanner, receipt printer, cash drawer, smart ring, sleep tracker,
kids tablet, smart glasses, dictation recorder, handheld vacuum, window fan, pedestal fan,
oil radiator, patio heater, electric wok, deep fryer, egg cooker, yogurt maker, food dehydrator,
vacuum sealer, kitchen scale, meat thermometer, electric knife, pasta maker, citrus press,
hot water dispenser, cold brew maker
"""
PRODUCTS = [name.strip() for name in PRODUCTS.replace("\n", " ").split(",") if name.strip()]
# Editions only appear above 216 products x 50 intents = 10,800 entries: a model line's
# near-duplicate entries ("Pro robot vacuum" next to "robot vacuum"), as real catalogues have.
EDITIONS = ("", "Pro", "Mini", "Max")


@dataclass(frozen=True)
class Intent:
    key: str
    question: str
    alias: str
    paraphrases: tuple[str, str]
    answer: str


INTENTS = [Intent(*row) for row in [
    ("reset", "How do I factory reset my {p}?", "reset {p} to factory settings",
     ("what are the steps to restore my {p} to its original factory state",
      "I want to wipe my {p} and start over from factory defaults"),
     "Hold the reset button of the {p} for ten seconds until the light blinks twice; all settings return "
     "to factory defaults and you can set it up again."),
    ("no-power", "My {p} won't turn on. What should I do?", "{p} does not power on",
     ("my {p} is completely dead and won't start", "what to do when the {p} doesn't switch on at all"),
     "Check the outlet with another device, then hold the power button of the {p} for 20 seconds. If it "
     "still shows no sign of life, book a repair."),
    ("warranty-length", "How long is the warranty on the {p}?", "{p} warranty period",
     ("for how many years is my {p} covered by the guarantee", "what is the guarantee duration for a {p}"),
     "The {p} has a two-year warranty from the date of delivery, three years if you register it."),
    ("warranty-claim", "How do I make a warranty claim for my {p}?", "{p} warranty claim",
     ("my {p} broke while still under warranty, how do I get it fixed for free",
      "where do I file a guarantee claim for a faulty {p}"),
     "Open **Orders**, pick the {p} and press *Report a problem*. Keep the serial number at hand."),
    ("return", "How do I return a {p}?", "return policy for the {p}",
     ("I want to send back the {p} I bought, how does that work", "can I give back a {p} I no longer want"),
     "You can return the {p} within 30 days. Print the label from **Orders** and drop the parcel at any "
     "pick-up point."),
    ("firmware", "How do I update the firmware on my {p}?", "{p} firmware update",
     ("how can I install the latest software version on my {p}", "where do I get new firmware for the {p}"),
     "Open the app, select the {p}, then *Settings → Firmware*. Keep it powered during the update."),
    ("clean", "How should I clean my {p}?", "{p} cleaning instructions",
     ("what is the right way to wash and clean the {p}", "which products can I use to clean my {p} safely"),
     "Unplug the {p} and wipe it with a soft damp cloth. No solvents, no dishwasher."),
    ("spare-parts", "Where can I buy spare parts for the {p}?", "{p} replacement parts",
     ("I need a replacement part for my {p}, where do I order it", "do you sell spare components for the {p}"),
     "Spare parts for the {p} are in our shop under *Parts*; search by the model number on the label."),
    ("manual", "Where can I download the user manual for the {p}?", "{p} user manual PDF",
     ("I lost the instruction booklet of my {p}, is there a digital copy",
      "where do I find the instructions for using the {p}"),
     "The manual of the {p} is on its product page under *Downloads*, as a PDF in twelve languages."),
    ("register", "How do I register my {p}?", "{p} product registration",
     ("how can I add my new {p} to my customer account", "where do I record the purchase of my {p}"),
     "Scan the QR code on the {p}'s box or enter its serial number under **Account → My products**."),
    ("delivery-time", "How long does delivery of a {p} take?", "{p} delivery time",
     ("when will my {p} order arrive", "how many days does shipping take for the {p}"),
     "A {p} in stock ships the next working day and arrives in two to four days."),
    ("ship-abroad", "Do you ship the {p} abroad?", "{p} international shipping",
     ("can I order a {p} to be delivered to another country", "is overseas delivery available for the {p}"),
     "We ship the {p} to the EU, the UK, Switzerland and Norway. Customs fees are shown at checkout."),
    ("price-match", "Do you price match on the {p}?", "{p} price match",
     ("I found the {p} cheaper elsewhere, will you match that price",
      "will you lower your price for the {p} if a competitor sells it for less"),
     "Yes: send us a link to a lower price for the same {p} from an authorised dealer within 14 days."),
    ("installments", "Can I pay for the {p} in installments?", "{p} monthly payments",
     ("is there a financing plan to spread the cost of the {p}", "can I buy the {p} now and pay over several months"),
     "Orders over 200 euros, the {p} included, can be paid in 3, 6 or 12 monthly installments."),
    ("restock", "When will the {p} be back in stock?", "{p} out of stock",
     ("the {p} is sold out, when can I order it again", "when do you expect new stock of the {p}"),
     "Press *Notify me* on the {p}'s page; we e-mail you the day it is back."),
    ("power-use", "How much power does the {p} use?", "{p} energy consumption",
     ("what is the electricity usage of the {p} in watts", "will the {p} increase my energy bill much"),
     "The {p}'s consumption is on its rating plate and in the data sheet under *Technical data*."),
    ("voltage", "Can I use the {p} with 110 V outlets abroad?", "{p} voltage compatibility",
     ("does the {p} work in countries with a different mains voltage",
      "do I need a voltage converter to use my {p} in the US"),
     "The {p} accepts 100–240 V; you only need a plug adapter, not a converter."),
    ("noise", "Why is my {p} making a strange noise?", "{p} noisy",
     ("my {p} has started rattling and buzzing loudly", "what causes unusual sounds coming from the {p}"),
     "Switch the {p} off and check for loose parts or debris. A noise that persists is a repair case."),
    ("red-light", "What does the blinking red light on my {p} mean?", "{p} red light flashing",
     ("there is a flashing red indicator on the {p}, what is wrong", "the {p} shows a blinking red LED"),
     "A blinking red light means the {p} found a fault. Restart it; if the light stays, contact support."),
    ("app", "How do I connect my {p} to the mobile app?", "pair {p} with the app",
     ("my phone app cannot find the {p}, how do I link them", "how do I set up the {p} in the companion app"),
     "In the app tap *Add device*, choose the {p} and hold its pairing button until the light pulses."),
    ("wifi", "How do I connect the {p} to Wi-Fi?", "{p} wifi setup",
     ("my {p} will not join my wireless network", "what are the steps to put the {p} on my home internet"),
     "The {p} uses 2.4 GHz Wi-Fi. Choose your network in the app and enter the password."),
    ("disconnects", "Why does my {p} keep disconnecting?", "{p} connection drops",
     ("the {p} loses its connection every few minutes", "how do I stop the {p} from dropping offline"),
     "Move the {p} closer to the router and update its firmware; most drop-outs stop there."),
    ("battery-replace", "Can I replace the battery in my {p}?", "{p} battery replacement",
     ("the battery of my {p} is worn out, can it be swapped", "do you offer a new battery for an old {p}"),
     "Yes: our service centre replaces the battery of the {p} for a fixed price in five working days."),
    ("charge-time", "How long does the {p} take to charge fully?", "{p} charging time",
     ("how many hours until the {p} battery is full", "what is the full recharge time of the {p}"),
     "With the supplied charger the {p} charges fully in about two and a half hours."),
    ("overheating", "Why does my {p} get hot?", "{p} overheating",
     ("the {p} becomes very warm when I use it, is that normal", "is it dangerous that my {p} heats up so much"),
     "Some warmth is normal. Keep the {p}'s vents free; if it gets too hot to touch, unplug it."),
    ("repair-book", "How do I book a repair for my {p}?", "{p} repair service",
     ("who can fix my broken {p} and how do I arrange it", "I need a technician to repair the {p}"),
     "Book a repair of the {p} under **Support → Repairs**; we send a prepaid box."),
    ("repair-cost", "How much does an out-of-warranty repair of the {p} cost?", "{p} repair price",
     ("what will I pay to fix my {p} now that the warranty has expired",
      "price of fixing a {p} without a guarantee"),
     "We quote before we repair: diagnosis of the {p} is free, parts and labour are shown before you agree."),
    ("box-contents", "What comes in the box with the {p}?", "{p} box contents",
     ("which accessories are included with the {p}", "what do I get in the package when I buy a {p}"),
     "The {p} comes with its power supply, a quick-start guide and the accessories listed on its page."),
    ("dimensions", "What are the dimensions of the {p}?", "{p} size and weight",
     ("how big and how heavy is the {p}", "will the {p} fit in a small space, what are its measurements"),
     "Size and weight of the {p} are on its product page under *Technical data*."),
    ("accessories", "Which accessories are compatible with the {p}?", "{p} compatible accessories",
     ("what add-ons can I use with my {p}", "do third-party extras work with the {p}"),
     "The {p}'s product page lists tested accessories; third-party ones work but are not covered."),
    ("recycle", "How do I recycle my old {p}?", "{p} disposal",
     ("what should I do with a {p} I want to throw away", "do you take back used {p} units for recycling"),
     "We take back an old {p} free of charge when we deliver a new one, or at any recycling centre."),
    ("trade-in", "Can I trade in my old {p}?", "{p} trade-in offer",
     ("do you give credit for my used {p} toward a new one", "how much will you pay for my old {p} if I upgrade"),
     "Yes: get a trade-in quote for your {p} online; the credit is paid when we receive it."),
    ("gift-wrap", "Can I have the {p} gift wrapped?", "{p} gift wrapping",
     ("is it possible to send the {p} as a wrapped present", "do you offer a gift box for the {p}"),
     "Choose *Gift wrapping* at checkout; the {p} ships wrapped, with a card and no invoice."),
    ("cancel-order", "How do I cancel my order for a {p}?", "cancel {p} order",
     ("I ordered a {p} by mistake and want to cancel it", "how can I stop my {p} purchase before it ships"),
     "Open **Orders** and press *Cancel* on the {p} until it ships; afterwards, return it instead."),
    ("change-address", "How do I change the delivery address for my {p} order?", "{p} order change address",
     ("I need my {p} delivered somewhere else", "can I update where my {p} is being shipped"),
     "Until the {p} ships, edit the address under **Orders**; afterwards, ask the carrier to redirect it."),
    ("damaged", "My {p} arrived damaged. What now?", "{p} damaged in transit",
     ("the {p} came broken in the box", "the parcel with my {p} was crushed and the device is cracked"),
     "Photograph the {p} and the box and report it within 48 hours; we send a replacement at once."),
    ("missing-part", "A part is missing from my {p} package.", "{p} missing parts",
     ("my {p} box did not include everything it should", "something was left out of the {p} delivery"),
     "Tell us which part of the {p} is missing under **Orders → Report a problem**; we ship it free."),
    ("setup", "How do I set up my {p} for the first time?", "{p} initial setup",
     ("I just unpacked my {p}, how do I get it running", "what is the first-time installation process for the {p}"),
     "Follow the quick-start guide in the box; the app walks you through the {p}'s setup in five minutes."),
    ("child-safety", "Is the {p} safe to use around children?", "{p} child safety",
     ("can kids be near the {p} while it is running", "does the {p} have a child lock"),
     "The {p} has a child lock in *Settings*; keep it out of reach of small children while in use."),
    ("outdoors", "Can the {p} be used outdoors?", "{p} outdoor use",
     ("is the {p} weatherproof enough for the garden", "can I leave the {p} outside in the rain"),
     "Only if its IP rating says so: check the {p}'s data sheet; most indoor models are not weatherproof."),
    ("water-damage", "My {p} got wet. Is it covered?", "{p} water damage",
     ("I spilled water on my {p}, will the warranty fix it", "does the guarantee cover liquid damage to the {p}"),
     "Liquid damage to the {p} is not covered by the warranty, but we repair it at a fixed price."),
    ("student", "Is there a student discount on the {p}?", "{p} student discount",
     ("do students pay less for the {p}", "can I get the {p} cheaper with a student card"),
     "Students get 10% off the {p} after verifying their status in their account."),
    ("business", "Do you offer business pricing for the {p}?", "{p} bulk order",
     ("is there a volume discount when ordering many {p} units", "we want to equip our office with the {p}"),
     "For ten or more units of the {p} our business team makes an offer within one working day."),
    ("extended-warranty", "Can I extend the warranty on my {p}?", "{p} extended warranty",
     ("is there an extra protection plan for the {p}", "how do I buy more years of coverage for my {p}"),
     "Within 60 days of purchase you can add two or three years of cover to the {p}."),
    ("serial", "Where do I find the serial number of my {p}?", "{p} serial number location",
     ("where is the serial code printed on the {p}", "I need the {p} serial for support, where is it"),
     "The serial number of the {p} is on the label underneath it and in the app under *About*."),
    ("slow", "Why is my {p} running slowly?", "{p} slow performance",
     ("the {p} has become sluggish and laggy", "how can I make my {p} fast again"),
     "Restart the {p} and install the latest firmware; a factory reset helps if it stays slow."),
    ("burning-smell", "Why does my {p} smell like burning?", "{p} burning smell",
     ("there is a burnt odour coming from my {p}", "my {p} smells of smoke when switched on"),
     "Unplug the {p} at once and do not use it again; contact support for a free safety check."),
    ("privacy", "What data does the {p} collect?", "{p} privacy",
     ("does the {p} send my personal information anywhere", "how does the {p} handle my privacy"),
     "The {p} sends only usage statistics you can switch off in the app; see our privacy notice."),
    ("eco-mode", "How do I turn on eco mode on the {p}?", "{p} energy saving mode",
     ("is there a power saving setting on my {p}", "how do I make the {p} use less electricity"),
     "Eco mode is under *Settings → Energy* on the {p}; it lowers consumption by about a fifth."),
    ("lifespan", "How long will my {p} last?", "{p} lifespan",
     ("what is the expected service life of a {p}", "how many years should a {p} keep working"),
     "With normal use a {p} lasts eight to ten years; spare parts are available for ten years."),
]]

RULE_TOPICS = {
    "Return policy": "Items may be returned within 30 days of delivery in their original packaging. "
                     "Refunds go back to the original payment method within five working days.",
    "Shipping policy": "Orders placed before 14:00 on a working day leave the warehouse the same day. "
                       "Heavy items are delivered by a freight carrier who calls ahead.",
    "Warranty terms": "All devices carry a two-year warranty. Wear parts, misuse and liquid damage are excluded.",
    "Price policy": "Prices include VAT. A price drop within 14 days of purchase is refunded on request.",
    "Payment rules": "We accept cards, bank transfer and installments for orders over 200 euros.",
    "Data protection rules": "Personal data is used only to fulfil orders and is deleted after the legal period.",
    "Repair policy": "Repairs take five working days. Out-of-warranty repairs start only after a quote is accepted.",
    "Recycling rules": "Old devices are taken back free of charge on delivery of an equivalent new device.",
    "Safety notice": "Devices with a damaged cable or a burning smell must be unplugged and not used again.",
    "Business customers": "Business orders of ten units or more get a dedicated contact and invoice payment.",
}
CATEGORIES = [
    "kitchen appliances", "audio equipment", "computers", "phones and tablets", "smart home devices",
    "garden tools", "personal care devices", "heating and cooling", "cleaning appliances", "cameras",
    "network equipment", "printers and scanners", "fitness equipment", "pet products", "e-mobility",
    "baby products", "office equipment", "musical instruments", "outdoor gear", "power and energy",
]
DOCUMENT_KINDS = {
    "care guide": ["Clean the device regularly with a soft, slightly damp cloth.",
                   "Store it in a dry place between 5 and 35 degrees.",
                   "Descale or clear filters as the manual describes; a clogged filter shortens its life."],
    "troubleshooting handbook": ["Most faults disappear after a restart and a firmware update.",
                                 "A blinking red light signals an internal fault; note the pattern before calling.",
                                 "Noise, heat or smell beyond the normal is a reason to stop using the device."],
    "installation guide": ["Unpack the device and keep the packaging for 30 days in case of a return.",
                           "Place it on a stable, level surface with room for ventilation.",
                           "Connect it to the app before first use so it receives the latest firmware."],
    "service handbook": ["Repairs are booked online; we send a prepaid box and return the device insured.",
                         "Diagnosis is free. Out-of-warranty work starts only after you accept the quote.",
                         "Spare parts remain available for ten years after the end of sales."],
}
HANDBOOK_COMMON = [
    "Keep the receipt or the order confirmation: it is your proof of purchase for warranty and repairs.",
    "Our support team answers by chat and phone on working days from 8:00 to 20:00 and on Saturdays until 16:00.",
    "Before calling, note the model number and serial number from the label and describe what happened.",
]


@dataclass(frozen=True)
class FaqSpec:
    question: str
    alias: str
    answer: str
    tags: tuple[str, ...]
    paraphrases: tuple[str, str]


def faq_capacity() -> int:
    return len(PRODUCTS) * len(INTENTS) * len(EDITIONS)


def faq_specs(count: int) -> list[FaqSpec]:
    """The first `count` FAQ entries, in a fixed order that mixes products and intents."""
    if not 0 < count <= faq_capacity():
        raise ValueError(f"between 1 and {faq_capacity()} entries")
    pairs = [(p, i) for p in range(len(PRODUCTS)) for i in range(len(INTENTS))]
    # A fixed shuffle: a small KB still holds many intents and products, not the first product's 50.
    random.Random(20240611).shuffle(pairs)
    specs = []
    for edition in EDITIONS:
        for product_index, intent_index in pairs:
            if len(specs) == count:
                return specs
            product = f"{edition} {PRODUCTS[product_index]}".strip()
            intent = INTENTS[intent_index]
            fill = lambda template: template.replace("{p}", product)  # noqa: E731
            question = fill(intent.question)
            specs.append(FaqSpec(
                question=question[0].upper() + question[1:],
                alias=fill(intent.alias),
                answer=fill(intent.answer),
                tags=(intent.key, PRODUCTS[product_index][:64]),
                paraphrases=(fill(intent.paraphrases[0]), fill(intent.paraphrases[1])),
            ))
    return specs


def context_specs(count: int) -> list[dict]:
    """`count` rule and document entries (context only): policies and handbooks per category."""
    rules = [(topic, text, category) for category in CATEGORIES for topic, text in RULE_TOPICS.items()]
    documents = [(kind, paragraphs, category) for category in CATEGORIES for kind, paragraphs in DOCUMENT_KINDS.items()]
    out: list[dict] = []
    while len(out) < count and (rules or documents):
        # Three rules for every two documents.
        if rules and (len(out) % 5 < 3 or not documents):
            topic, text, category = rules.pop(0)
            out.append({"kind": Entry.Kind.RULE, "question": f"{topic} for {category}",
                        "answer": f"{text} This applies to all {category}.", "tags": ["policy"]})
        else:
            kind, paragraphs, category = documents.pop(0)
            # Six paragraphs of 150-250 characters: split into two passages, as a real handbook is.
            body = "\n\n".join(
                f"{sentence} For {category}, the exact figures are in each model's data sheet."
                for sentence in [*paragraphs, *HANDBOOK_COMMON]
            )
            out.append({"kind": Entry.Kind.DOCUMENT, "question": f"{category.capitalize()} {kind}",
                        "answer": body, "tags": ["handbook"]})
    return out


def context_count(faq_count: int) -> int:
    # "A few hundred" at 10,000 entries; at least a handful in quick mode.
    return min(max(10, faq_count // 40), len(CATEGORIES) * (len(RULE_TOPICS) + len(DOCUMENT_KINDS)))


# --- the bench database ---------------------------------------------------------------------------


def database_use(name: str, *, pool_size: int) -> bool:
    """Create database `name` on the configured server if missing and point Django at it.

    Must run before anything in this process connects: the connection pool is built
    on the first connection and would keep pointing at the developer's database.
    Returns True if the database was created.
    """
    created = False
    with connection._nodb_cursor() as cursor:  # Django's own route to the `postgres` database
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if cursor.fetchone() is None:
            cursor.execute(f'CREATE DATABASE "{name}"')
            created = True
    connections.close_all()
    db = settings.DATABASES["default"]
    db["NAME"] = name
    options = dict(db["OPTIONS"])
    if options.get("pool"):
        # One pooled connection per benchmark thread, or threads would queue for the pool
        # and the queueing would show up as KB latency.
        pool = dict(options["pool"]) if isinstance(options["pool"], dict) else {}
        pool["max_size"] = max(pool.get("max_size", 0), pool_size)
        options["pool"] = pool
    db["OPTIONS"] = options
    connection.settings_dict.update(NAME=name, OPTIONS=options)
    return created


def database_drop(name: str) -> None:
    connections.close_all()
    connection.close_pool()
    with connection._nodb_cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def url_with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path="/" + name).geturl()


# --- building the KB ----------------------------------------------------------------------------


def kb_matches(specs: list[FaqSpec], extra: int) -> bool:
    """Is the bench database's KB the one these specs describe?"""
    stored = set(Entry.objects.filter(kind=Entry.Kind.FAQ).values_list("question", flat=True))
    return stored == {spec.question for spec in specs} and Entry.objects.exclude(kind=Entry.Kind.FAQ).count() == extra


def kb_build(specs: list[FaqSpec], extra: list[dict]) -> None:
    """Replace the KB by these entries, in one transaction, without vectors.

    The rows mirror what `services.entry_create` writes (validated fields; phrasings
    for FAQ entries only; passages split like `_rebuild_texts`), but in one bulk
    insert per table instead of four statements per entry.
    """
    rows = [entry_validate({"question": s.question, "answer": s.answer, "kind": Entry.Kind.FAQ,
                            "aliases": [s.alias], "tags": list(s.tags), "threshold": None}) for s in specs]
    rows += [entry_validate({**fields, "threshold": None}) for fields in extra]
    with transaction.atomic():
        with connection.cursor() as cursor:
            # CASCADE reaches phrasings, passages, their vectors and misses; models stay.
            cursor.execute("TRUNCATE knowledge_entry RESTART IDENTITY CASCADE")
        entries = Entry.objects.bulk_create([Entry(**fields) for fields in rows], batch_size=2000)
        phrasings, passages = [], []
        for entry in entries:
            if entry.kind == Entry.Kind.FAQ:
                seen = set()
                for index, text in enumerate([entry.question, *entry.aliases]):
                    key = normalize(text)
                    if key and key not in seen:
                        seen.add(key)
                        phrasings.append(Phrasing(entry=entry, text=text, normalized=key, primary=index == 0))
            if entry.kind == Entry.Kind.DOCUMENT:
                chunks = split_passages(entry.answer, settings.KB_PASSAGE_CHARS)
            else:
                chunks = [f"{entry.question}\n{entry.answer}"]
            passages += [Passage(entry=entry, ordinal=i, text=chunk) for i, chunk in enumerate(chunks)]
        Phrasing.objects.bulk_create(phrasings, batch_size=5000)
        Passage.objects.bulk_create(passages, batch_size=5000)


def analyze() -> None:
    with connection.cursor() as cursor:
        for table in ("knowledge_entry", "knowledge_phrasing", "knowledge_passage",
                      "knowledge_phrasingvector", "knowledge_passagevector"):
            cursor.execute(f"ANALYZE {table}")


# --- query sets ---------------------------------------------------------------------------------


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c for c in text)


# How a user types a stored question differently; each still normalizes to the same key.
TYPING_STYLES = (
    str.lower,
    str.upper,
    _fullwidth,
    lambda s: "  " + s.rstrip("?.").replace(" ", "   ") + " !!",
    lambda s: s.title().rstrip("?") + "??",
)

# Spellings of one query that the (uncased) embedding model and `normalize` treat alike but the
# query-vector LRU, keyed on the raw text, does not: each timed run gets fresh strings.
SPELLINGS = (
    lambda s: s,
    lambda s: s[:1].swapcase() + s[1:],
    str.upper,
    lambda s: s.title() if s.title() != s else s.lower(),
)


def spelled(queries: list[str], variant: int) -> list[str]:
    return [SPELLINGS[variant](q) for q in queries]


def exact_queries(specs: list[FaqSpec], count: int, rng: random.Random) -> list[tuple[str, str]]:
    """(typed query, stored question) for distinct entries: the question or the alias, retyped."""
    out = []
    for index, spec in enumerate(rng.sample(specs, min(count, len(specs)))):
        stored = spec.question if index % 2 == 0 else spec.alias
        for style in TYPING_STYLES[index % len(TYPING_STYLES):] + TYPING_STYLES:
            typed = style(stored)
            if typed != stored:
                break
        out.append((typed, spec.question))
    return out


def paraphrase_attempts(specs: list[FaqSpec], rng: random.Random) -> list[tuple[str, str]]:
    """(paraphrase, stored question) for every entry, in random order, one paraphrase per entry."""
    return [(spec.paraphrases[rng.randrange(2)], spec.question) for spec in rng.sample(specs, len(specs))]


@dataclass
class Paraphrases:
    hits: list[str] = field(default_factory=list)  # answered by the vector road
    misses: list[str] = field(default_factory=list)  # not answered
    tried: int = 0
    right: int = 0  # hits that returned the entry the paraphrase was made from
    exact: int = 0  # paraphrases that happen to normalize to a stored phrasing
    reasons: Counter = field(default_factory=Counter)


def paraphrases_classify(attempts: list[tuple[str, str]], pk_of: dict[str, int], wanted: int) -> Paraphrases:
    """Ask each (paraphrase, stored question) until `wanted` hits and misses: the class is what happened."""
    out = Paraphrases()
    for text, question in attempts:
        if len(out.hits) >= wanted and len(out.misses) >= wanted:
            break
        out.tried += 1
        result = direct_answer(text)
        if result.hit and result.method == "vector":
            out.hits.append(text)
            out.right += result.entry.pk == pk_of[question]
        elif result.hit:
            out.exact += 1
        else:
            out.misses.append(text)
            # "best score 0.712 is below the threshold 0.80" -> "best score N is below the threshold N"
            out.reasons[re.sub(r"[\d.]+", "N", result.reason.split("(")[0]).replace("KB#N ", "").strip()] += 1
    return out


OFF_DOMAIN = [
    ("What is the capital of {x}?", "Australia, Canada, Brazil, Kenya, Peru, Norway, Vietnam, Morocco, Chile, Nepal, "
     "Ghana, Iceland, Mongolia, Portugal, Jordan, Uruguay, Finland, Laos, Latvia, Bolivia, Slovenia, Senegal, "
     "Ecuador, Bhutan, Malta"),
    ("How many calories are in {x}?", "a banana, an avocado, a croissant, a boiled egg, a glass of milk, a bagel, "
     "a slice of pizza, a bowl of rice, a mango, a chocolate bar, a cup of oatmeal, a pear, a donut, a latte, "
     "a handful of almonds, a baked potato, a cheeseburger, a bowl of ramen, a kiwi, a glass of red wine"),
    ("Who wrote {x}?", "Moby Dick, War and Peace, Pride and Prejudice, Don Quixote, Ulysses, Middlemarch, "
     "The Trial, Beloved, Dracula, Frankenstein, Hamlet, The Odyssey, Madame Bovary, Jane Eyre, "
     "One Hundred Years of Solitude, The Brothers Karamazov, Things Fall Apart, The Little Prince"),
    ("What will the weather be like in {x} tomorrow?", "Lisbon, Oslo, Nairobi, Osaka, Denver, Krakow, Lima, "
     "Hanoi, Dublin, Tunis, Perth, Quebec, Bergen, Seville, Cusco, Tallinn, Porto, Bruges, Valparaiso, Salzburg"),
    ("How do I say {x} in Italian?", "good morning, thank you very much, where is the station, I am lost, "
     "the bill please, nice to meet you, how old are you, I love this song, see you tomorrow, happy birthday, "
     "what a beautiful day, I would like a coffee, where is the beach, my name is Anna, excuse me"),
    ("Give me a recipe for {x}", "lentil soup, banana bread, pad thai, shakshuka, risotto, gazpacho, "
     "apple crumble, fish tacos, mushroom stroganoff, chickpea curry, carrot cake, ramen broth, "
     "lemon tart, beef stew, falafel, paella, pumpkin pie, miso soup, tiramisu, onion soup"),
    ("Explain {x} in simple terms", "photosynthesis, inflation, the theory of relativity, plate tectonics, "
     "compound interest, natural selection, the water cycle, supply and demand, black holes, vaccines, "
     "quantum entanglement, the greenhouse effect, the stock market, DNA replication, the immune system"),
    ("When was {x} born?", "Marie Curie, Leonardo da Vinci, Ada Lovelace, Nelson Mandela, Frida Kahlo, "
     "Charles Darwin, Nikola Tesla, Jane Austen, Mahatma Gandhi, Wolfgang Amadeus Mozart, Simone de Beauvoir, "
     "Isaac Newton, Rosalind Franklin, Pablo Picasso, Alan Turing"),
    ("What are the rules of {x}?", "cricket, chess, water polo, curling, rugby, badminton, handball, "
     "go, backgammon, lacrosse, petanque, squash, fencing, table tennis, bridge, mahjong, sumo, polo"),
    ("Is it a good idea to visit {x} in winter?", "Lapland, Patagonia, Hokkaido, the Alps, Quebec City, "
     "the Scottish Highlands, Iceland, Vienna, Prague, New York, Tasmania, the Dolomites, Kyoto, Budapest"),
    ("How tall is {x}?", "Mount Everest, the Eiffel Tower, the Burj Khalifa, Kilimanjaro, the Statue of Liberty, "
     "Mont Blanc, a giraffe, the Great Pyramid of Giza, Big Ben, the Matterhorn, a redwood tree, Table Mountain"),
    ("What does a {x} eat?", "koala, hedgehog, flamingo, sea otter, giant panda, anteater, axolotl, toucan, "
     "manatee, red fox, snow leopard, hummingbird, blue whale, chameleon, barn owl"),
    ("Who won the {x}?", "1998 football World Cup, 2012 Tour de France, 1980 Wimbledon final, "
     "2016 Olympic marathon, 1969 Super Bowl, 2004 Eurovision Song Contest, 1995 Rugby World Cup, "
     "2010 Nobel Prize in Literature, 1977 Ashes series, 2008 Champions League final"),
]


def off_domain_queries(rng: random.Random) -> list[str]:
    queries = [template.replace("{x}", filler.strip()) for template, fillers in OFF_DOMAIN
               for filler in fillers.split(",")]
    rng.shuffle(queries)
    return queries


# --- timing -------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks, like numpy's default."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * p
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Run:
    label: str
    where: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)  # seconds, of successful calls
    outcomes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    wall: float = 0.0

    @property
    def n(self) -> int:
        return len(self.latencies)

    def ms(self, p: float) -> float:
        return 1000 * percentile(self.latencies, p)

    @property
    def mean_ms(self) -> float:
        return 1000 * sum(self.latencies) / len(self.latencies) if self.latencies else float("nan")

    @property
    def rate(self) -> float:
        return self.n / self.wall if self.wall else float("nan")


def run_threads(run: Run, queries: list[str], call: Callable[[object, str], str], *,
                open_state: Callable[[], object] = lambda: None,
                close_state: Callable[[object], None] = lambda state: None) -> Run:
    """Ask every query once, from `run.concurrency` threads; `call` returns the outcome's label.

    Each thread opens its own state (a DB connection happens implicitly, an HTTP
    connection explicitly) and closes it when done. Threads are daemons and check
    `stop`, so Ctrl-C in the main thread ends the run.
    """
    lock = threading.Lock()
    position = iter(range(len(queries)))
    stop = threading.Event()
    start = threading.Barrier(run.concurrency + 1)

    def worker():
        state = open_state()
        try:
            start.wait()
            while not stop.is_set():
                with lock:
                    index = next(position, None)
                if index is None:
                    return
                began = time.perf_counter()
                try:
                    outcome = call(state, queries[index])
                except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                    with lock:
                        run.errors[f"{type(exc).__name__}: {exc}"[:160]] += 1
                    continue
                elapsed = time.perf_counter() - began
                with lock:
                    run.latencies.append(elapsed)
                    run.outcomes[outcome] += 1
        finally:
            close_state(state)
            connections.close_all()  # this thread's connections go back to the pool

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(run.concurrency)]
    for thread in threads:
        thread.start()
    try:
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
        run.wall = time.perf_counter() - began
    finally:
        stop.set()
    return run


def outcome_of(result) -> str:
    return result.method if result.hit else "miss"


# --- HTTP against a real daphne -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextlib.contextmanager
def daphne_server(*, env: dict[str, str], log_path: Path, start_timeout: float = 60.0) -> Iterator[int]:
    """A daphne process on a free loopback port, stopped on exit whatever happens. Yields the port."""
    port = free_port()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
            cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: stopping it takes any child with it
        )
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"daphne exited with {process.returncode}:\n{_tail(log_path)}")
            with contextlib.suppress(OSError):
                status, _ = http_get(port, "/healthz", timeout=2)
                if status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not answer /healthz within {start_timeout:.0f} s:\n{_tail(log_path)}")
            time.sleep(0.2)
        yield port
    finally:
        _stop_group(process)


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def http_get(port: int, path: str, *, cookie: str = "", timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Cookie": cookie} if cookie else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class AnswerClient:
    """One keep-alive connection to /api/kb/answer, reconnecting once if the server closed it."""

    def __init__(self, port: int, auth: dict[str, str], timeout: float = 10.0):
        self.port, self.auth, self.timeout = port, auth, timeout
        self.conn: http.client.HTTPConnection | None = None
        self.reconnects = 0

    def ask(self, question: str) -> dict:
        path = "/api/kb/answer?q=" + quote(question)
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                self.conn.request("GET", path, headers={**self.auth, "Accept": "application/json"})
                response = self.conn.getresponse()
                body = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A kept-alive connection the server closed meanwhile: one fresh try, no more.
                self.close()
                if attempt:
                    raise
                self.reconnects += 1
                continue
            if response.will_close:
                self.close()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
            return json.loads(body)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _bench_staff():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="bench-staff", defaults={"is_staff": True})
    if not user.is_staff or user.has_usable_password():
        user.is_staff = True
        user.set_unusable_password()
        user.save()
    return user


def staff_auth(kind: str) -> dict[str, str]:
    """Request headers that authenticate a staff user of the bench database, as a client would.

    `key`: an API key with the `kb` scope (an integration's call); `session`: the session
    cookie a browser login would set.
    """
    user = _bench_staff()
    if kind == "key":
        from chat.models import ApiKey
        from chat.services import apikey_create

        ApiKey.objects.filter(user=user, name="bench_kb").delete()
        _, raw = apikey_create(user=user, name="bench_kb", scopes=[ApiKey.Scope.KB])
        return {"Authorization": f"Bearer {raw}"}
    from importlib import import_module

    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return {"Cookie": f"{settings.SESSION_COOKIE_NAME}={session.session_key}"}


def server_env(database: str) -> dict[str, str]:
    """The environment of the benchmark's daphne: production-like settings on the bench database.

    The secret key is this process's: the session cookie was signed with it.
    """
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=url_with_database(settings.DATABASE_URL, database),
        REDIS_URL=settings.REDIS_URL,
        DEBUG="false",
        SECRET_KEY=settings.SECRET_KEY,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        SECURE_SSL_REDIRECT="false",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    return env


# --- where the time goes -------------------------------------------------------------------------


@dataclass
class Breakdown:
    total: list[float] = field(default_factory=list)
    sql: list[float] = field(default_factory=list)
    statements: list[int] = field(default_factory=list)
    embedding: list[float] = field(default_factory=list)


def call_breakdown(spec, texts: list[str]) -> Breakdown:
    """Per direct_answer call: its time, its SQL time and statements, and (apart) the embedding's time."""
    out = Breakdown()
    query_cache().clear()
    for text in texts:
        spent = [0.0, 0]

        def timed(execute, sql, params, many, context, spent=spent):
            began = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                spent[0] += time.perf_counter() - began
                spent[1] += 1

        began = time.perf_counter()
        with connection.execute_wrapper(timed):
            result = direct_answer(text)
        out.total.append(time.perf_counter() - began)
        out.sql.append(spent[0])
        out.statements.append(spent[1])
        if result.method != "exact":
            # The same text again, straight to the model (no cache): the embedding's share.
            began = time.perf_counter()
            embed_texts(spec, [text])
            out.embedding.append(time.perf_counter() - began)
    return out


# --- the embedding model ----------------------------------------------------------------------


def embedding_threads(count: int | None = None) -> int:
    """Threads per embedding call in this process: `count`, else KB_EMBEDDING_THREADS (0: the runtime's)."""
    return settings.KB_EMBEDDING_THREADS if count is None else count


def embedding_options(spec, texts: list[str]) -> list[tuple[str, list[float], float]]:
    """(setting, latencies, worst cosine to the served vector) of one-query embeddings, local model.

    Builds one embedder per runtime and thread count, the served one among them, to show what
    each choice costs. Settings take turns query by query, so a burst of load elsewhere hits
    them all alike. PyTorch's threads are process-wide: set before each of its calls.
    """
    import numpy as np
    import torch

    from knowledge.embeddings import LocalEmbedder, embedder_for

    served = embedder_for(spec)
    served.embed(texts[:1])
    options = [(f"{served.runtime}, {settings.KB_EMBEDDING_THREADS or 'default'} thread(s) (as served)", served,
                settings.KB_EMBEDDING_THREADS)]
    for runtime in ("onnx", "torch"):
        for threads in (1, 2):
            if (runtime, threads) != (served.runtime, settings.KB_EMBEDDING_THREADS):
                options.append((f"{runtime}, {threads} thread(s)", LocalEmbedder(spec, runtime=runtime,
                                                                               threads=threads), threads))
    torch_default = torch.get_num_threads()
    reference = [np.asarray(vector) for vector in served.embed(texts)]
    latencies = {label: [] for label, _, _ in options}
    worst = {label: 1.0 for label, _, _ in options}
    try:
        for label, embedder, threads in options:
            embedder.embed(texts[:1])  # load outside the timing
        for text, expected in zip(texts, reference):
            for label, embedder, threads in options:
                torch.set_num_threads(threads or torch_default)
                began = time.perf_counter()
                (vector,) = embedder.embed([text])
                latencies[label].append(time.perf_counter() - began)
                worst[label] = min(worst[label], float(np.dot(vector, expected)))
    finally:
        torch.set_num_threads(torch_default)
    return [(label, latencies[label], worst[label]) for label, _, _ in options]


# --- pgvector -----------------------------------------------------------------------------------


PHRASINGS = ("knowledge_phrasingvector", "phrasing")


@dataclass
class Nearest:
    runs: list[Run]  # as the product calls it, its whole statement, a wider HNSW search, no index at all
    recall: dict[str, tuple[float, float]]  # run label -> (recall@1, recall@10) against the exact scan


WIDER_EF_SEARCH = 100


def nearest_timings(model: EmbeddingModel, vectors) -> Nearest:
    """`_nearest` as served, the whole vector-match statement around it, the scan with
    hnsw.ef_search raised, and with index scans off (the exact answer)."""
    settings_of = {
        "pgvector top-40": (),
        f"pgvector top-40, ef_search={WIDER_EF_SEARCH}": (f"SET LOCAL hnsw.ef_search = {WIDER_EF_SEARCH}",),
        "pgvector top-40, no index": ("SET LOCAL enable_indexscan = off",),
    }
    runs, found = [], {}
    for label, statements in settings_of.items():
        run = Run(label, "postgres", 1)
        found[label] = []
        for vector in vectors:
            began = time.perf_counter()
            if statements:
                rows = with_settings(statements, lambda vector=vector: _nearest(*PHRASINGS, model, vector, 40))
            else:
                rows = _nearest(*PHRASINGS, model, vector, 40)
            run.latencies.append(time.perf_counter() - began)
            found[label].append([pid for pid, _ in rows])
        run.wall = sum(run.latencies)
        runs.append(run)
    # The statement the vector road sends: the same index scan, joined to phrasings and entries.
    run = Run("faq match statement", "postgres", 1)
    for vector in vectors:
        began = time.perf_counter()
        faq_matches("", model=model, vector=vector)
        run.latencies.append(time.perf_counter() - began)
    run.wall = sum(run.latencies)
    runs.insert(1, run)
    exact = found["pgvector top-40, no index"]
    recall = {}
    for label, ids in found.items():
        pairs = list(zip(ids, exact))
        recall[label] = (sum(a[:1] == b[:1] for a, b in pairs) / len(pairs),
                         sum(len(set(a[:10]) & set(b[:10])) for a, b in pairs) / (10 * len(pairs)))
    return Nearest(runs=runs, recall=recall)


@dataclass
class Plan:
    text: str
    index_used: bool
    executions: list[float]  # server-side execution times of several such queries, seconds
    ef_search: str
    forced: str = ""  # the HNSW plan with the alternatives switched off, when the planner chose another


def nearest_plan(model: EmbeddingModel, vectors) -> Plan:
    """EXPLAIN ANALYZE of the exact statement `_nearest` sends, captured on its way out."""
    statements = [captured_sql(lambda vector=vector: _nearest(*PHRASINGS, model, vector, 40))[0]
                  for vector in vectors[:30]]
    plans = [explain(sql, params) for sql, params in statements]
    executions = [float(m.group(1)) / 1000 for p in plans if (m := re.search(r"Execution Time: ([\d.]+) ms", p))]
    ef_search = "?"
    with contextlib.suppress(Exception), connection.cursor() as cursor:
        # Known only once pgvector is loaded in this session, which the queries above did.
        cursor.execute("SHOW hnsw.ef_search")
        ef_search = cursor.fetchone()[0]
    plan = Plan(text=plans[0], index_used="hnsw" in plans[0].lower(), executions=executions, ef_search=ef_search)
    if not plan.index_used:
        # Without a sequential scan the planner would still sort a btree scan; with neither, only
        # the HNSW path is left, and its estimated cost shows why the planner passed it over.
        plan.forced = explain(*statements[0], settings_sql=("SET LOCAL enable_seqscan = off",
                                                            "SET LOCAL enable_sort = off"))
    return plan


def elide_vectors(plan: str) -> str:
    return re.sub(r"'\[[^']{40,}\]'", "'[…vector…]'", plan)


def captured_sql(call: Callable[[], object]) -> list[tuple[str, object]]:
    """The SQL statements (with parameters) that `call` runs on this thread's connection."""
    statements = []

    def capture(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        call()
    return statements


def explain(sql: str, params, *, analyze: bool = True, settings_sql: tuple[str, ...] = ()) -> str:
    """EXPLAIN of one statement; `settings_sql` (SET LOCAL ...) applies to this statement only."""
    options = "ANALYZE, BUFFERS" if analyze else "COSTS"
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in settings_sql:
            cursor.execute(statement)
        cursor.execute(f"EXPLAIN ({options}) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def with_settings(settings_sql: tuple[str, ...], call: Callable[[], object]):
    with transaction.atomic():
        with connection.cursor() as cursor:
            for statement in settings_sql:
                cursor.execute(statement)
        return call()


def hnsw_indexes(model: EmbeddingModel) -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, pg_size_pretty(pg_relation_size(format('%%I', indexname)::regclass)) "
            "FROM pg_indexes WHERE tablename IN ('knowledge_phrasingvector', 'knowledge_passagevector') "
            "AND indexdef ILIKE '%%USING hnsw%%' AND indexname LIKE %s ORDER BY indexname",
            [f"%_hnsw_m{int(model.pk)}"],
        )
        return cursor.fetchall()


def server_versions() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version'), "
                       "(SELECT extversion FROM pg_extension WHERE extname = 'vector')")
        postgres, pgvector = cursor.fetchone()
    return f"PostgreSQL {postgres}, pgvector {pgvector}"
