"""Five JSON Schemas (nested objects, enums, arrays) and ten requests for each: the structured-output row of
bench/decode.py. The prompts say what to write, in words, as a person using ``response_format`` would; the schema
itself reaches the model only through constrained decoding."""

from __future__ import annotations

from typing import Any

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "job": {"type": "string"}},
        "required": ["name", "age", "job"],
        "additionalProperties": False,
    },
    "weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "temperature_c": {"type": "number"},
            "conditions": {"enum": ["sunny", "cloudy", "rainy", "snowy", "windy"]},
        },
        "required": ["city", "temperature_c", "conditions"],
        "additionalProperties": False,
    },
    "recipe": {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "ingredients": {"type": "array", "items": {"type": "string"}},
            "minutes": {"type": "integer"},
        },
        "required": ["title", "ingredients", "minutes"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "customer": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "address": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                        "required": ["city", "country"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            },
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"product": {"type": "string"}, "quantity": {"type": "integer"}},
                    "required": ["product", "quantity"],
                    "additionalProperties": False,
                },
            },
            "status": {"enum": ["pending", "shipped", "delivered"]},
        },
        "required": ["customer", "items", "status"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "date": {"type": "string"},
            "attendees": {"type": "array", "items": {"type": "string"}},
            "online": {"type": "boolean"},
        },
        "required": ["title", "date", "attendees", "online"],
        "additionalProperties": False,
    },
}

_SUBJECTS = ["teacher", "pilot", "baker", "nurse", "farmer", "painter", "chef", "doctor", "sailor", "writer"]
_CITIES = ["Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Sydney", "Toronto", "Madrid", "Nairobi", "Seoul"]
_DISHES = [
    "pancakes",
    "tomato soup",
    "apple pie",
    "fried rice",
    "guacamole",
    "lentil curry",
    "omelette",
    "banana bread",
    "pesto pasta",
    "lemonade",
]
_GOODS = [
    "two books",
    "a lamp",
    "three mugs",
    "a bicycle",
    "shoes",
    "a laptop",
    "four pens",
    "a tent",
    "coffee beans",
    "a guitar",
]
_EVENTS = [
    "a birthday party",
    "a team meeting",
    "a book club",
    "a wedding",
    "a chess tournament",
    "a yoga class",
    "a product launch",
    "a school reunion",
    "a concert",
    "a hackathon",
]

REQUESTS: list[tuple[str, str]] = (
    [("person", f"Describe a fictional {s}: name, age and job, as JSON.") for s in _SUBJECTS]
    + [("weather", f"Give today's weather in {c} as JSON: city, temperature in Celsius, conditions.") for c in _CITIES]
    + [("recipe", f"Give a short recipe for {d} as JSON: title, ingredients, minutes.") for d in _DISHES]
    + [("order", f"Write an example shop order of {g} as JSON: customer with address, items, status.") for g in _GOODS]
    + [("event", f"Describe {e} as JSON: title, date, attendees, whether it is online.") for e in _EVENTS]
)
