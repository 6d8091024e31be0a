"""The KB benchmark's data: a synthetic KB, its build, and the query sets that time it.

The KB is combinatorial (products x intents x editions), so any size up to its capacity
comes out the same every time and a re-run recognises a KB it built earlier. Query sets are
built so that no string is asked twice in timed runs: the query-embedding LRU must not
flatter the figures.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field

from django.db import connection, transaction

from knowledge.models import Entry
from knowledge.selectors import direct_answer
from knowledge.services import entry_create

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


INTENTS = [
    Intent(*row)
    for row in [
        (
            "reset",
            "How do I factory reset my {p}?",
            "reset {p} to factory settings",
            (
                "what are the steps to restore my {p} to its original factory state",
                "I want to wipe my {p} and start over from factory defaults",
            ),
            "Hold the reset button of the {p} for ten seconds until the light blinks twice; all settings return "
            "to factory defaults and you can set it up again.",
        ),
        (
            "no-power",
            "My {p} won't turn on. What should I do?",
            "{p} does not power on",
            (
                "my {p} is completely dead and won't start",
                "what to do when the {p} doesn't switch on at all",
            ),
            "Check the outlet with another device, then hold the power button of the {p} for 20 seconds. If it "
            "still shows no sign of life, book a repair.",
        ),
        (
            "warranty-length",
            "How long is the warranty on the {p}?",
            "{p} warranty period",
            (
                "for how many years is my {p} covered by the guarantee",
                "what is the guarantee duration for a {p}",
            ),
            "The {p} has a two-year warranty from the date of delivery, three years if you register it.",
        ),
        (
            "warranty-claim",
            "How do I make a warranty claim for my {p}?",
            "{p} warranty claim",
            (
                "my {p} broke while still under warranty, how do I get it fixed for free",
                "where do I file a guarantee claim for a faulty {p}",
            ),
            "Open **Orders**, pick the {p} and press *Report a problem*. Keep the serial number at hand.",
        ),
        (
            "return",
            "How do I return a {p}?",
            "return policy for the {p}",
            (
                "I want to send back the {p} I bought, how does that work",
                "can I give back a {p} I no longer want",
            ),
            "You can return the {p} within 30 days. Print the label from **Orders** and drop the parcel at any "
            "pick-up point.",
        ),
        (
            "firmware",
            "How do I update the firmware on my {p}?",
            "{p} firmware update",
            (
                "how can I install the latest software version on my {p}",
                "where do I get new firmware for the {p}",
            ),
            "Open the app, select the {p}, then *Settings → Firmware*. Keep it powered during the update.",
        ),
        (
            "clean",
            "How should I clean my {p}?",
            "{p} cleaning instructions",
            (
                "what is the right way to wash and clean the {p}",
                "which products can I use to clean my {p} safely",
            ),
            "Unplug the {p} and wipe it with a soft damp cloth. No solvents, no dishwasher.",
        ),
        (
            "spare-parts",
            "Where can I buy spare parts for the {p}?",
            "{p} replacement parts",
            (
                "I need a replacement part for my {p}, where do I order it",
                "do you sell spare components for the {p}",
            ),
            "Spare parts for the {p} are in our shop under *Parts*; search by the model number on the label.",
        ),
        (
            "manual",
            "Where can I download the user manual for the {p}?",
            "{p} user manual PDF",
            (
                "I lost the instruction booklet of my {p}, is there a digital copy",
                "where do I find the instructions for using the {p}",
            ),
            "The manual of the {p} is on its product page under *Downloads*, as a PDF in twelve languages.",
        ),
        (
            "register",
            "How do I register my {p}?",
            "{p} product registration",
            (
                "how can I add my new {p} to my customer account",
                "where do I record the purchase of my {p}",
            ),
            "Scan the QR code on the {p}'s box or enter its serial number under **Account → My products**.",
        ),
        (
            "delivery-time",
            "How long does delivery of a {p} take?",
            "{p} delivery time",
            ("when will my {p} order arrive", "how many days does shipping take for the {p}"),
            "A {p} in stock ships the next working day and arrives in two to four days.",
        ),
        (
            "ship-abroad",
            "Do you ship the {p} abroad?",
            "{p} international shipping",
            (
                "can I order a {p} to be delivered to another country",
                "is overseas delivery available for the {p}",
            ),
            "We ship the {p} to the EU, the UK, Switzerland and Norway. Customs fees are shown at checkout.",
        ),
        (
            "price-match",
            "Do you price match on the {p}?",
            "{p} price match",
            (
                "I found the {p} cheaper elsewhere, will you match that price",
                "will you lower your price for the {p} if a competitor sells it for less",
            ),
            "Yes: send us a link to a lower price for the same {p} from an authorised dealer within 14 days.",
        ),
        (
            "installments",
            "Can I pay for the {p} in installments?",
            "{p} monthly payments",
            (
                "is there a financing plan to spread the cost of the {p}",
                "can I buy the {p} now and pay over several months",
            ),
            "Orders over 200 euros, the {p} included, can be paid in 3, 6 or 12 monthly installments.",
        ),
        (
            "restock",
            "When will the {p} be back in stock?",
            "{p} out of stock",
            (
                "the {p} is sold out, when can I order it again",
                "when do you expect new stock of the {p}",
            ),
            "Press *Notify me* on the {p}'s page; we e-mail you the day it is back.",
        ),
        (
            "power-use",
            "How much power does the {p} use?",
            "{p} energy consumption",
            (
                "what is the electricity usage of the {p} in watts",
                "will the {p} increase my energy bill much",
            ),
            "The {p}'s consumption is on its rating plate and in the data sheet under *Technical data*.",
        ),
        (
            "voltage",
            "Can I use the {p} with 110 V outlets abroad?",
            "{p} voltage compatibility",
            (
                "does the {p} work in countries with a different mains voltage",
                "do I need a voltage converter to use my {p} in the US",
            ),
            "The {p} accepts 100–240 V; you only need a plug adapter, not a converter.",
        ),
        (
            "noise",
            "Why is my {p} making a strange noise?",
            "{p} noisy",
            (
                "my {p} has started rattling and buzzing loudly",
                "what causes unusual sounds coming from the {p}",
            ),
            "Switch the {p} off and check for loose parts or debris. A noise that persists is a repair case.",
        ),
        (
            "red-light",
            "What does the blinking red light on my {p} mean?",
            "{p} red light flashing",
            (
                "there is a flashing red indicator on the {p}, what is wrong",
                "the {p} shows a blinking red LED",
            ),
            "A blinking red light means the {p} found a fault. Restart it; if the light stays, contact support.",
        ),
        (
            "app",
            "How do I connect my {p} to the mobile app?",
            "pair {p} with the app",
            (
                "my phone app cannot find the {p}, how do I link them",
                "how do I set up the {p} in the companion app",
            ),
            "In the app tap *Add device*, choose the {p} and hold its pairing button until the light pulses.",
        ),
        (
            "wifi",
            "How do I connect the {p} to Wi-Fi?",
            "{p} wifi setup",
            (
                "my {p} will not join my wireless network",
                "what are the steps to put the {p} on my home internet",
            ),
            "The {p} uses 2.4 GHz Wi-Fi. Choose your network in the app and enter the password.",
        ),
        (
            "disconnects",
            "Why does my {p} keep disconnecting?",
            "{p} connection drops",
            (
                "the {p} loses its connection every few minutes",
                "how do I stop the {p} from dropping offline",
            ),
            "Move the {p} closer to the router and update its firmware; most drop-outs stop there.",
        ),
        (
            "battery-replace",
            "Can I replace the battery in my {p}?",
            "{p} battery replacement",
            (
                "the battery of my {p} is worn out, can it be swapped",
                "do you offer a new battery for an old {p}",
            ),
            "Yes: our service centre replaces the battery of the {p} for a fixed price in five working days.",
        ),
        (
            "charge-time",
            "How long does the {p} take to charge fully?",
            "{p} charging time",
            (
                "how many hours until the {p} battery is full",
                "what is the full recharge time of the {p}",
            ),
            "With the supplied charger the {p} charges fully in about two and a half hours.",
        ),
        (
            "overheating",
            "Why does my {p} get hot?",
            "{p} overheating",
            (
                "the {p} becomes very warm when I use it, is that normal",
                "is it dangerous that my {p} heats up so much",
            ),
            "Some warmth is normal. Keep the {p}'s vents free; if it gets too hot to touch, unplug it.",
        ),
        (
            "repair-book",
            "How do I book a repair for my {p}?",
            "{p} repair service",
            (
                "who can fix my broken {p} and how do I arrange it",
                "I need a technician to repair the {p}",
            ),
            "Book a repair of the {p} under **Support → Repairs**; we send a prepaid box.",
        ),
        (
            "repair-cost",
            "How much does an out-of-warranty repair of the {p} cost?",
            "{p} repair price",
            (
                "what will I pay to fix my {p} now that the warranty has expired",
                "price of fixing a {p} without a guarantee",
            ),
            "We quote before we repair: diagnosis of the {p} is free, parts and labour are shown before you agree.",
        ),
        (
            "box-contents",
            "What comes in the box with the {p}?",
            "{p} box contents",
            (
                "which accessories are included with the {p}",
                "what do I get in the package when I buy a {p}",
            ),
            "The {p} comes with its power supply, a quick-start guide and the accessories listed on its page.",
        ),
        (
            "dimensions",
            "What are the dimensions of the {p}?",
            "{p} size and weight",
            (
                "how big and how heavy is the {p}",
                "will the {p} fit in a small space, what are its measurements",
            ),
            "Size and weight of the {p} are on its product page under *Technical data*.",
        ),
        (
            "accessories",
            "Which accessories are compatible with the {p}?",
            "{p} compatible accessories",
            ("what add-ons can I use with my {p}", "do third-party extras work with the {p}"),
            "The {p}'s product page lists tested accessories; third-party ones work but are not covered.",
        ),
        (
            "recycle",
            "How do I recycle my old {p}?",
            "{p} disposal",
            (
                "what should I do with a {p} I want to throw away",
                "do you take back used {p} units for recycling",
            ),
            "We take back an old {p} free of charge when we deliver a new one, or at any recycling centre.",
        ),
        (
            "trade-in",
            "Can I trade in my old {p}?",
            "{p} trade-in offer",
            (
                "do you give credit for my used {p} toward a new one",
                "how much will you pay for my old {p} if I upgrade",
            ),
            "Yes: get a trade-in quote for your {p} online; the credit is paid when we receive it.",
        ),
        (
            "gift-wrap",
            "Can I have the {p} gift wrapped?",
            "{p} gift wrapping",
            (
                "is it possible to send the {p} as a wrapped present",
                "do you offer a gift box for the {p}",
            ),
            "Choose *Gift wrapping* at checkout; the {p} ships wrapped, with a card and no invoice.",
        ),
        (
            "cancel-order",
            "How do I cancel my order for a {p}?",
            "cancel {p} order",
            (
                "I ordered a {p} by mistake and want to cancel it",
                "how can I stop my {p} purchase before it ships",
            ),
            "Open **Orders** and press *Cancel* on the {p} until it ships; afterwards, return it instead.",
        ),
        (
            "change-address",
            "How do I change the delivery address for my {p} order?",
            "{p} order change address",
            (
                "I need my {p} delivered somewhere else",
                "can I update where my {p} is being shipped",
            ),
            "Until the {p} ships, edit the address under **Orders**; afterwards, ask the carrier to redirect it.",
        ),
        (
            "damaged",
            "My {p} arrived damaged. What now?",
            "{p} damaged in transit",
            (
                "the {p} came broken in the box",
                "the parcel with my {p} was crushed and the device is cracked",
            ),
            "Photograph the {p} and the box and report it within 48 hours; we send a replacement at once.",
        ),
        (
            "missing-part",
            "A part is missing from my {p} package.",
            "{p} missing parts",
            (
                "my {p} box did not include everything it should",
                "something was left out of the {p} delivery",
            ),
            "Tell us which part of the {p} is missing under **Orders → Report a problem**; we ship it free.",
        ),
        (
            "setup",
            "How do I set up my {p} for the first time?",
            "{p} initial setup",
            (
                "I just unpacked my {p}, how do I get it running",
                "what is the first-time installation process for the {p}",
            ),
            "Follow the quick-start guide in the box; the app walks you through the {p}'s setup in five minutes.",
        ),
        (
            "child-safety",
            "Is the {p} safe to use around children?",
            "{p} child safety",
            ("can kids be near the {p} while it is running", "does the {p} have a child lock"),
            "The {p} has a child lock in *Settings*; keep it out of reach of small children while in use.",
        ),
        (
            "outdoors",
            "Can the {p} be used outdoors?",
            "{p} outdoor use",
            (
                "is the {p} weatherproof enough for the garden",
                "can I leave the {p} outside in the rain",
            ),
            "Only if its IP rating says so: check the {p}'s data sheet; most indoor models are not weatherproof.",
        ),
        (
            "water-damage",
            "My {p} got wet. Is it covered?",
            "{p} water damage",
            (
                "I spilled water on my {p}, will the warranty fix it",
                "does the guarantee cover liquid damage to the {p}",
            ),
            "Liquid damage to the {p} is not covered by the warranty, but we repair it at a fixed price.",
        ),
        (
            "student",
            "Is there a student discount on the {p}?",
            "{p} student discount",
            ("do students pay less for the {p}", "can I get the {p} cheaper with a student card"),
            "Students get 10% off the {p} after verifying their status in their account.",
        ),
        (
            "business",
            "Do you offer business pricing for the {p}?",
            "{p} bulk order",
            (
                "is there a volume discount when ordering many {p} units",
                "we want to equip our office with the {p}",
            ),
            "For ten or more units of the {p} our business team makes an offer within one working day.",
        ),
        (
            "extended-warranty",
            "Can I extend the warranty on my {p}?",
            "{p} extended warranty",
            (
                "is there an extra protection plan for the {p}",
                "how do I buy more years of coverage for my {p}",
            ),
            "Within 60 days of purchase you can add two or three years of cover to the {p}.",
        ),
        (
            "serial",
            "Where do I find the serial number of my {p}?",
            "{p} serial number location",
            (
                "where is the serial code printed on the {p}",
                "I need the {p} serial for support, where is it",
            ),
            "The serial number of the {p} is on the label underneath it and in the app under *About*.",
        ),
        (
            "slow",
            "Why is my {p} running slowly?",
            "{p} slow performance",
            ("the {p} has become sluggish and laggy", "how can I make my {p} fast again"),
            "Restart the {p} and install the latest firmware; a factory reset helps if it stays slow.",
        ),
        (
            "burning-smell",
            "Why does my {p} smell like burning?",
            "{p} burning smell",
            (
                "there is a burnt odour coming from my {p}",
                "my {p} smells of smoke when switched on",
            ),
            "Unplug the {p} at once and do not use it again; contact support for a free safety check.",
        ),
        (
            "privacy",
            "What data does the {p} collect?",
            "{p} privacy",
            (
                "does the {p} send my personal information anywhere",
                "how does the {p} handle my privacy",
            ),
            "The {p} sends only usage statistics you can switch off in the app; see our privacy notice.",
        ),
        (
            "eco-mode",
            "How do I turn on eco mode on the {p}?",
            "{p} energy saving mode",
            (
                "is there a power saving setting on my {p}",
                "how do I make the {p} use less electricity",
            ),
            "Eco mode is under *Settings → Energy* on the {p}; it lowers consumption by about a fifth.",
        ),
        (
            "lifespan",
            "How long will my {p} last?",
            "{p} lifespan",
            (
                "what is the expected service life of a {p}",
                "how many years should a {p} keep working",
            ),
            "With normal use a {p} lasts eight to ten years; spare parts are available for ten years.",
        ),
    ]
]

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
    "kitchen appliances",
    "audio equipment",
    "computers",
    "phones and tablets",
    "smart home devices",
    "garden tools",
    "personal care devices",
    "heating and cooling",
    "cleaning appliances",
    "cameras",
    "network equipment",
    "printers and scanners",
    "fitness equipment",
    "pet products",
    "e-mobility",
    "baby products",
    "office equipment",
    "musical instruments",
    "outdoor gear",
    "power and energy",
]
DOCUMENT_KINDS = {
    "care guide": [
        "Clean the device regularly with a soft, slightly damp cloth.",
        "Store it in a dry place between 5 and 35 degrees.",
        "Descale or clear filters as the manual describes; a clogged filter shortens its life.",
    ],
    "troubleshooting handbook": [
        "Most faults disappear after a restart and a firmware update.",
        "A blinking red light signals an internal fault; note the pattern before calling.",
        "Noise, heat or smell beyond the normal is a reason to stop using the device.",
    ],
    "installation guide": [
        "Unpack the device and keep the packaging for 30 days in case of a return.",
        "Place it on a stable, level surface with room for ventilation.",
        "Connect it to the app before first use so it receives the latest firmware.",
    ],
    "service handbook": [
        "Repairs are booked online; we send a prepaid box and return the device insured.",
        "Diagnosis is free. Out-of-warranty work starts only after you accept the quote.",
        "Spare parts remain available for ten years after the end of sales.",
    ],
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
            specs.append(
                FaqSpec(
                    question=question[0].upper() + question[1:],
                    alias=fill(intent.alias),
                    answer=fill(intent.answer),
                    tags=(intent.key, PRODUCTS[product_index][:64]),
                    paraphrases=(fill(intent.paraphrases[0]), fill(intent.paraphrases[1])),
                )
            )
    return specs


def context_specs(count: int) -> list[dict]:
    """`count` rule and document entries (context only): policies and handbooks per category."""
    rules = [
        (topic, text, category) for category in CATEGORIES for topic, text in RULE_TOPICS.items()
    ]
    documents = [
        (kind, paragraphs, category)
        for category in CATEGORIES
        for kind, paragraphs in DOCUMENT_KINDS.items()
    ]
    out: list[dict] = []
    while len(out) < count and (rules or documents):
        # Three rules for every two documents.
        if rules and (len(out) % 5 < 3 or not documents):
            topic, text, category = rules.pop(0)
            out.append(
                {
                    "kind": Entry.Kind.RULE,
                    "question": f"{topic} for {category}",
                    "answer": f"{text} This applies to all {category}.",
                    "tags": ["policy"],
                }
            )
        else:
            kind, paragraphs, category = documents.pop(0)
            # Six paragraphs of 150-250 characters: split into two passages, as a real handbook is.
            body = "\n\n".join(
                f"{sentence} For {category}, the exact figures are in each model's data sheet."
                for sentence in [*paragraphs, *HANDBOOK_COMMON]
            )
            out.append(
                {
                    "kind": Entry.Kind.DOCUMENT,
                    "question": f"{category.capitalize()} {kind}",
                    "answer": body,
                    "tags": ["handbook"],
                }
            )
    return out


def context_count(faq_count: int) -> int:
    # "A few hundred" at 10,000 entries; at least a handful in quick mode.
    return min(max(10, faq_count // 40), len(CATEGORIES) * (len(RULE_TOPICS) + len(DOCUMENT_KINDS)))


# --- building the KB ----------------------------------------------------------------------------


def kb_matches(specs: list[FaqSpec], extra: int) -> bool:
    """Is the bench database's KB the one these specs describe?"""
    stored = set(Entry.objects.filter(kind=Entry.Kind.FAQ).values_list("question", flat=True))
    return (
        stored == {spec.question for spec in specs}
        and Entry.objects.exclude(kind=Entry.Kind.FAQ).count() == extra
    )


def kb_build(specs: list[FaqSpec], extra: list[dict]) -> None:
    """Replace the KB by these entries, in one transaction, without vectors.

    Each entry goes through `entry_create`, as a curator's would: the phrasings and passages
    are the product's own, not a copy of its rules that could drift. A statement or more per
    row is slower than bulk inserts, but the KB is built once per size and its embedding,
    which follows, takes far longer.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            # CASCADE reaches phrasings, passages, their vectors and misses; models stay.
            cursor.execute("TRUNCATE knowledge_entry RESTART IDENTITY CASCADE")
        for spec in specs:
            entry_create(
                question=spec.question,
                answer=spec.answer,
                kind=Entry.Kind.FAQ,
                aliases=[spec.alias],
                tags=list(spec.tags),
                embed="none",
            )
        for fields in extra:
            entry_create(**fields, embed="none")


def analyze() -> None:
    with connection.cursor() as cursor:
        for table in (
            "knowledge_entry",
            "knowledge_phrasing",
            "knowledge_passage",
            "knowledge_phrasingvector",
            "knowledge_passagevector",
        ):
            cursor.execute(f"ANALYZE {table}")


# --- query sets ---------------------------------------------------------------------------------


def _fullwidth(text: str) -> str:
    return "".join(
        chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c for c in text
    )


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
        for style in TYPING_STYLES[index % len(TYPING_STYLES) :] + TYPING_STYLES:
            typed = style(stored)
            if typed != stored:
                break
        out.append((typed, spec.question))
    return out


def paraphrase_attempts(specs: list[FaqSpec], rng: random.Random) -> list[tuple[str, str]]:
    """(paraphrase, stored question) for every entry, in random order, one paraphrase per entry."""
    return [
        (spec.paraphrases[rng.randrange(2)], spec.question)
        for spec in rng.sample(specs, len(specs))
    ]


@dataclass
class Paraphrases:
    hits: list[str] = field(default_factory=list)  # answered by the vector road
    misses: list[str] = field(default_factory=list)  # not answered
    tried: int = 0
    right: int = 0  # hits that returned the entry the paraphrase was made from
    exact: int = 0  # paraphrases that happen to normalize to a stored phrasing
    reasons: Counter = field(default_factory=Counter)


def paraphrases_classify(
    attempts: list[tuple[str, str]], pk_of: dict[str, int], wanted: int
) -> Paraphrases:
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
            out.reasons[
                re.sub(r"[\d.]+", "N", result.reason.split("(")[0]).replace("KB#N ", "").strip()
            ] += 1
    return out


OFF_DOMAIN = [
    (
        "What is the capital of {x}?",
        "Australia, Canada, Brazil, Kenya, Peru, Norway, Vietnam, Morocco, Chile, Nepal, "
        "Ghana, Iceland, Mongolia, Portugal, Jordan, Uruguay, Finland, Laos, Latvia, Bolivia, Slovenia, Senegal, "
        "Ecuador, Bhutan, Malta",
    ),
    (
        "How many calories are in {x}?",
        "a banana, an avocado, a croissant, a boiled egg, a glass of milk, a bagel, "
        "a slice of pizza, a bowl of rice, a mango, a chocolate bar, a cup of oatmeal, a pear, a donut, a latte, "
        "a handful of almonds, a baked potato, a cheeseburger, a bowl of ramen, a kiwi, a glass of red wine",
    ),
    (
        "Who wrote {x}?",
        "Moby Dick, War and Peace, Pride and Prejudice, Don Quixote, Ulysses, Middlemarch, "
        "The Trial, Beloved, Dracula, Frankenstein, Hamlet, The Odyssey, Madame Bovary, Jane Eyre, "
        "One Hundred Years of Solitude, The Brothers Karamazov, Things Fall Apart, The Little Prince",
    ),
    (
        "What will the weather be like in {x} tomorrow?",
        "Lisbon, Oslo, Nairobi, Osaka, Denver, Krakow, Lima, "
        "Hanoi, Dublin, Tunis, Perth, Quebec, Bergen, Seville, Cusco, Tallinn, Porto, Bruges, Valparaiso, Salzburg",
    ),
    (
        "How do I say {x} in Italian?",
        "good morning, thank you very much, where is the station, I am lost, "
        "the bill please, nice to meet you, how old are you, I love this song, see you tomorrow, happy birthday, "
        "what a beautiful day, I would like a coffee, where is the beach, my name is Anna, excuse me",
    ),
    (
        "Give me a recipe for {x}",
        "lentil soup, banana bread, pad thai, shakshuka, risotto, gazpacho, "
        "apple crumble, fish tacos, mushroom stroganoff, chickpea curry, carrot cake, ramen broth, "
        "lemon tart, beef stew, falafel, paella, pumpkin pie, miso soup, tiramisu, onion soup",
    ),
    (
        "Explain {x} in simple terms",
        "photosynthesis, inflation, the theory of relativity, plate tectonics, "
        "compound interest, natural selection, the water cycle, supply and demand, black holes, vaccines, "
        "quantum entanglement, the greenhouse effect, the stock market, DNA replication, the immune system",
    ),
    (
        "When was {x} born?",
        "Marie Curie, Leonardo da Vinci, Ada Lovelace, Nelson Mandela, Frida Kahlo, "
        "Charles Darwin, Nikola Tesla, Jane Austen, Mahatma Gandhi, Wolfgang Amadeus Mozart, Simone de Beauvoir, "
        "Isaac Newton, Rosalind Franklin, Pablo Picasso, Alan Turing",
    ),
    (
        "What are the rules of {x}?",
        "cricket, chess, water polo, curling, rugby, badminton, handball, "
        "go, backgammon, lacrosse, petanque, squash, fencing, table tennis, bridge, mahjong, sumo, polo",
    ),
    (
        "Is it a good idea to visit {x} in winter?",
        "Lapland, Patagonia, Hokkaido, the Alps, Quebec City, "
        "the Scottish Highlands, Iceland, Vienna, Prague, New York, Tasmania, the Dolomites, Kyoto, Budapest",
    ),
    (
        "How tall is {x}?",
        "Mount Everest, the Eiffel Tower, the Burj Khalifa, Kilimanjaro, the Statue of Liberty, "
        "Mont Blanc, a giraffe, the Great Pyramid of Giza, Big Ben, the Matterhorn, a redwood tree, Table Mountain",
    ),
    (
        "What does a {x} eat?",
        "koala, hedgehog, flamingo, sea otter, giant panda, anteater, axolotl, toucan, "
        "manatee, red fox, snow leopard, hummingbird, blue whale, chameleon, barn owl",
    ),
    (
        "Who won the {x}?",
        "1998 football World Cup, 2012 Tour de France, 1980 Wimbledon final, "
        "2016 Olympic marathon, 1969 Super Bowl, 2004 Eurovision Song Contest, 1995 Rugby World Cup, "
        "2010 Nobel Prize in Literature, 1977 Ashes series, 2008 Champions League final",
    ),
]


def off_domain_queries(rng: random.Random) -> list[str]:
    queries = [
        template.replace("{x}", filler.strip())
        for template, fillers in OFF_DOMAIN
        for filler in fillers.split(",")
    ]
    rng.shuffle(queries)
    return queries
