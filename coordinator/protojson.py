"""Protobuf JSON parsed and written without json_format's per-field Python walk, for messages of
plain fields.

Guarantee: `parse(raw, cls)` returns exactly what `json_format.Parse(raw, cls())` returns, or
raises what it raises; `dumps(message)` returns exactly what `json_format.MessageToJson(message,
indent=None, sort_keys=True)` (holdfast's stored form) returns. The fast parse takes only what
holdfast's own encoder writes — a UTF-8 JSON object with no repeated key, each key a field's JSON
name, each value of its field's own JSON type (an integer as a number or a plain decimal string, an
enum by name, a bool, a string, an object, an array of objects) — and builds the message in one
constructor call. Anything else (a proto field name, a null, a float, an enum number, a duplicate
key, bytes that are not UTF-8, a message type with maps, oneofs, floats or bytes) is handed to
json_format whole, so its answer, or its error, is the one given; `dumps` likewise hands over any
message whose type has a field of another kind, or a well-known type. Why: json_format spent ~50
to 80 µs a record each way, a listing of 10,000 records parsed every one, and every transition
writes three (docs/benchmarks.md); this path takes ~18 µs to parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)
Convert = Callable[[Any], Any]
Fields = dict[str, tuple[str, Convert]]  # JSON name -> (field name, value converter)

DECIMAL = re.compile(r"-?[0-9]+")  # json_format's int() would also take "+1", " 1", "1_0": left to it
INTEGER_TYPES = frozenset({
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64,
})


class NotPlain(Exception):
    """The input or the message type is outside the fast path: json_format decides."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise NotPlain  # json_format refuses a repeated key; a dict would keep the last one
    return found


def _integer(value: Any) -> int:
    if type(value) is int:
        return value
    if type(value) is str and DECIMAL.fullmatch(value):
        return int(value)
    raise NotPlain


def _exactly(kind: type) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not kind:
            raise NotPlain
        return value
    return convert


def _enum(field: FieldDescriptor) -> Convert:
    numbers = {value.name: value.number for value in field.enum_type.values}

    def convert(value: Any) -> int:
        if type(value) is not str or value not in numbers:
            raise NotPlain
        return numbers[value]
    return convert


def _message(fields: Fields, repeated: bool) -> Convert:
    if repeated:
        def convert_all(value: Any) -> list[dict[str, Any]]:
            if type(value) is not list:
                raise NotPlain
            return [_arguments(item, fields) for item in value]
        return convert_all
    return lambda value: _arguments(value, fields)


def _compile(descriptor: Descriptor, compiled: dict[str, Fields]) -> Fields:
    """Each field's JSON name with its converter; NotPlain for a type outside the fast path."""
    if descriptor.full_name in compiled:
        return compiled[descriptor.full_name]
    if descriptor.oneofs or descriptor.GetOptions().map_entry:
        raise NotPlain
    fields: Fields = {}
    compiled[descriptor.full_name] = fields  # before the fields: a message may contain itself
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            convert = _message(_compile(field.message_type, compiled), field.is_repeated)
        elif field.is_repeated:
            raise NotPlain
        elif field.type in INTEGER_TYPES:
            convert = _integer
        elif field.type == FieldDescriptor.TYPE_STRING:
            convert = _exactly(str)
        elif field.type == FieldDescriptor.TYPE_BOOL:
            convert = _exactly(bool)
        elif field.type == FieldDescriptor.TYPE_ENUM:
            convert = _enum(field)
        else:
            raise NotPlain
        fields[field.json_name] = (field.name, convert)
    return fields


def _arguments(value: Any, fields: Fields) -> dict[str, Any]:
    """A JSON object as constructor arguments (a nested message as a dict, which the constructor
    takes and marks present even when empty, as json_format does)."""
    if type(value) is not dict:
        raise NotPlain
    arguments = {}
    for key, item in value.items():
        found = fields.get(key)
        if found is None:
            raise NotPlain
        name, convert = found
        arguments[name] = convert(item)
    return arguments


_plain: dict[type[Message], Fields | None] = {}


def _fields_of(cls: type[Message]) -> Fields | None:
    if cls not in _plain:
        try:
            _plain[cls] = _compile(cls.DESCRIPTOR, {})
        except NotPlain:
            _plain[cls] = None
    return _plain[cls]


def parse(raw: bytes | str, cls: type[M]) -> M:
    fields = _fields_of(cls)
    if fields is not None:
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            return cls(**_arguments(json.loads(text, object_pairs_hook=_object), fields))
        except (NotPlain, ValueError, TypeError):
            pass  # UnicodeDecodeError and JSONDecodeError are ValueErrors; so is an out-of-range int
    return json_format.Parse(raw, cls())


# --- writing ----------------------------------------------------------------------------------
_writers: dict[FieldDescriptor, Convert] = {}
INT64_CPP_TYPES = frozenset({FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64})


def _writer(field: FieldDescriptor) -> Convert:
    """The field's value as json_format writes it; NotPlain for a kind it writes otherwise."""
    found = _writers.get(field)
    if found is None:
        found = _writers[field] = _compile_writer(field)
    return found


def _compile_writer(field: FieldDescriptor) -> Convert:
    one = _compile_one_writer(field)
    return (lambda values: [one(value) for value in values]) if field.is_repeated else one


def _compile_one_writer(field: FieldDescriptor) -> Convert:
    if field.is_extension:
        raise NotPlain  # written under its "[full.name]"
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        kind = field.message_type
        if kind.GetOptions().map_entry or kind.full_name.startswith("google.protobuf."):
            raise NotPlain  # a map, or a well-known type with its own JSON form
        return _json_object
    if field.type in INTEGER_TYPES:
        return str if field.cpp_type in INT64_CPP_TYPES else int
    if field.type == FieldDescriptor.TYPE_STRING:
        return str
    if field.type == FieldDescriptor.TYPE_BOOL:
        return bool
    if field.type == FieldDescriptor.TYPE_ENUM and not field.enum_type.is_closed:
        names = {value.number: value.name for value in field.enum_type.values}
        if any(value.GetOptions().ListFields() for value in field.enum_type.values):
            raise NotPlain  # an option (e.g. a JSON name) json_format may honour
        return lambda number: names.get(number, number)  # an open enum's unknown value: its number
    raise NotPlain


def _json_object(message: Message) -> dict[str, Any]:
    return {field.json_name: _writer(field)(value) for field, value in message.ListFields()}


def dumps(message: Message) -> str:
    try:
        if message.DESCRIPTOR.full_name.startswith("google.protobuf."):
            raise NotPlain
        return json.dumps(_json_object(message), sort_keys=True)
    except NotPlain:
        return json_format.MessageToJson(message, indent=None, sort_keys=True)
