"""Proxmox VE's own parameter checks, from the API description shipped beside this module.

`api-subset.json` is the api-viewer's data for the 28 paths a provider uses (an OpenAPI 3
rendering). `Schema.check` answers, for one request, the errors Proxmox's JSONSchema.pm
would give (an unknown parameter, a missing one, a wrong type, a value out of range or
outside its enum, a string too long or of the wrong format), keyed by parameter name, so the
fake refuses what the real API refuses and the tests can prove the client never sends such a
request. The messages are Proxmox's own wording where we know it.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

BOOLEAN = re.compile(r"^(1|true|yes|on|0|false|no|off)$", re.IGNORECASE)
INTEGER = re.compile(r"^[+-]?\d+$")
NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
# `ipconfig[n]`: "n is 0 to 31" in most descriptions; where a description is silent, 31.
INDEXED = re.compile(r"^(?P<stem>[a-z_0-9-]+)\[n\]$")
INDEX_RANGE = re.compile(r"\(n is 0 to (\d+)\)")

_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"
_FORMATS: dict[str, tuple[re.Pattern[str], str]] = {
    "pve-node": (re.compile(rf"^{_LABEL}$"), "value does not look like a valid node name"),
    "dns-name": (re.compile(rf"^{_LABEL}(\.{_LABEL})*$"),
                 "value does not look like a valid DNS name"),
    "pve-storage-id": (re.compile(r"^[a-z][a-z0-9_.-]*[a-z0-9]$", re.I),
                       "storage ID contains illegal characters"),
    "pve-poolid": (re.compile(r"^[A-Za-z0-9._-]+$"), "invalid pool ID"),
    "pve-configid": (re.compile(r"^[a-z][a-z0-9_-]+$", re.I), "invalid configuration ID"),
    "pve-userid": (re.compile(r"^[^\s:/]+@[A-Za-z][A-Za-z0-9._-]+$"), "invalid user ID"),
    "pve-roleid": (re.compile(r"^[A-Za-z0-9._-]+$"), "invalid role ID"),
    "pve-bridge-id": (re.compile(r"^[-_.\w\d]+$"), "invalid bridge ID"),
    "pve-volume-id": (re.compile(r"^[a-z][a-z0-9_.-]*[a-z0-9]:.+$", re.I),
                      "unable to parse volume ID"),
    "urlencoded": (re.compile(r"^[-%a-zA-Z0-9_.!~*'()]*$"), "invalid urlencoded string"),
    "mac-addr": (re.compile(r"^[0-9a-f][02468ace](:[0-9a-f]{2}){5}$", re.I), "invalid MAC address"),
    "pve-tag": (re.compile(r"^[a-z0-9_][a-z0-9_+.-]*$", re.I), "invalid tag"),
}  # fmt: skip
_LISTS = {  # a list format: its separators and the format of each item
    "pve-configid-list": "pve-configid",
    "pve-tag-list": "pve-tag",
    "pve-storage-id-list": "pve-storage-id",
    "pve-userid-list": "pve-userid",
    "pve-roleid-list": "pve-roleid",
    "pve-vmid-list": "pve-vmid",
}
# Property-string formats the description names rather than spells out (PVE/QemuServer.pm).
_NAMED_OBJECTS: dict[str, dict[str, dict[str, Any]]] = {
    "pve-qm-ipconfig": {
        "ip": {"type": "string", "format": "ip-or-dhcp", "optional": 1},
        "gw": {"type": "string", "format": "ipv4", "optional": 1},
        "ip6": {"type": "string", "format": "ip6-or-auto", "optional": 1},
        "gw6": {"type": "string", "format": "ipv6", "optional": 1},
    },
    "pve-qm-smbios1": {
        key: {"type": "string", "optional": 1}
        for key in ("family", "manufacturer", "product", "serial", "sku", "uuid", "version")
    }
    | {"base64": {"type": "boolean", "optional": 1}},
    "pve-qm-cicustom": {
        key: {"type": "string", "format": "pve-volume-id", "optional": 1}
        for key in ("meta", "network", "user", "vendor")
    },
}


class Invalid(ValueError):
    """One parameter's error, worded as Proxmox words it."""


@dataclass(frozen=True)
class Operation:
    method: str
    template: str  # "/nodes/{node}/qemu/{vmid}/clone"
    path_params: dict[str, str]
    spec: Mapping[str, Any]


class Schema:
    """The API description: which operation a request is, and what is wrong with it."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.paths: Mapping[str, Mapping[str, Any]] = document["paths"]
        self._routes = [
            (re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", t) + "$"), t)
            for t in self.paths
        ]

    def operation(self, method: str, path: str) -> Operation | None:
        """The operation `method path` is (path relative to /api2/json), or None."""
        for pattern, template in self._routes:
            found = pattern.match(path)
            if found and method.lower() in self.paths[template]:
                spec = self.paths[template][method.lower()]
                return Operation(method.upper(), template, found.groupdict(), spec)
        return None

    def known_path(self, path: str) -> bool:
        return any(pattern.match(path) for pattern, _ in self._routes)

    def check(self, operation: Operation, params: Mapping[str, str]) -> dict[str, str]:
        """Every error in `params` (path parameters included), keyed by name; empty: valid."""
        given = {**params, **operation.path_params}
        declared = {p["name"]: p for p in operation.spec.get("parameters", [])}
        errors: dict[str, str] = {}
        for name, value in given.items():
            param = _declared(declared, name)
            if param is None:
                errors[name] = (
                    "property is not defined in schema and the schema does not allow "
                    "additional properties"
                )
                continue
            try:
                check_value(param["schema"], value)
            except Invalid as exc:
                errors[name] = str(exc)
        for name, param in declared.items():
            if param.get("required") and not INDEXED.match(name) and name not in given:
                errors[name] = "property is missing and it is not optional"
        return errors


def _declared(declared: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    if name in declared:
        return declared[name]  # type: ignore[no-any-return]
    indexed = re.match(r"^(?P<stem>[a-z_-]+)(?P<n>\d+)$", name)
    if indexed is None:
        return None
    param = declared.get(f"{indexed['stem']}[n]")
    if param is None:
        return None
    top = INDEX_RANGE.search(param.get("description", ""))
    return param if int(indexed["n"]) <= (int(top.group(1)) if top else 31) else None


def check_value(schema: Mapping[str, Any], value: str) -> None:
    """Raise Invalid if `value` (as sent on the wire, a string) breaks `schema`."""
    kind = schema.get("type", "string")
    if kind == "boolean":
        if not BOOLEAN.match(value):
            raise Invalid(f"type check ('boolean') failed - got '{value}'")
        return
    if kind in ("integer", "number"):
        if not (INTEGER if kind == "integer" else NUMBER).match(value.strip()):
            raise Invalid(f"type check ('{kind}') failed - got '{value}'")
        number = float(value)
        if "minimum" in schema and number < float(schema["minimum"]):
            raise Invalid(f"value must have a minimum value of {schema['minimum']}")
        if "maximum" in schema and number > float(schema["maximum"]):
            raise Invalid(f"value must have a maximum value of {schema['maximum']}")
        return
    if "enum" in schema and value not in schema["enum"]:
        raise Invalid(
            f"value '{value}' does not have a value in the enumeration "
            f"'{', '.join(schema['enum'])}'"
        )
    if "maxLength" in schema and len(value) > int(schema["maxLength"]):
        raise Invalid(f"value may only be {schema['maxLength']} characters long")
    if "pattern" in schema and not re.fullmatch(_perl_pattern(schema["pattern"]), value):
        raise Invalid("value does not match the regex pattern")
    fmt = schema.get("format")
    if isinstance(fmt, dict):
        check_property_string(fmt, value)
    elif isinstance(fmt, str):
        check_format(fmt, value)


def check_format(fmt: str, value: str) -> None:
    if fmt in _NAMED_OBJECTS:
        check_property_string(_NAMED_OBJECTS[fmt], value)
        if fmt == "pve-qm-smbios1":
            _check_smbios_base64(value)
        return
    if fmt in _LISTS:
        for item in (i for i in re.split(r"[;,\s]+", value) if i):
            check_format(_LISTS[fmt], item)
        return
    check = _SPECIAL.get(fmt)
    if check is not None:
        if not check(value):
            raise Invalid(f"value does not look like a valid {fmt.removeprefix('pve-')}")
        return
    known = _FORMATS.get(fmt)
    if known is not None and not known[0].match(value):
        raise Invalid(f"{known[1]}: '{value}'")


def check_property_string(keys: Mapping[str, Mapping[str, Any]], value: str) -> None:
    """A property string (`virtio,bridge=vmbr0,firewall=1`): every key known and valid, the
    default key given bare, and every key that is not optional present."""
    default_key = next((k for k, s in keys.items() if s.get("default_key")), None)
    seen: dict[str, str] = {}
    for part in (p for p in value.split(",") if p):
        key, equals, item = part.partition("=")
        if not equals:
            if default_key is None or default_key in seen:
                raise Invalid(f"invalid format - value without key, but schema does not define "
                              f"a default key: '{part}'")  # fmt: skip
            key, item = default_key, part
        spec = keys.get(key)
        if spec is None:
            raise Invalid(f"invalid format - unknown key '{key}'")
        if "alias" in spec:  # `virtio=MAC`: the key names the model, the value the address
            if "keyAlias" in spec:
                seen[spec["keyAlias"]] = key
            key, spec = spec["alias"], keys[spec["alias"]]
        if key in seen:
            raise Invalid(f"invalid format - duplicate key in comma-separated list property: {key}")
        try:
            check_value(spec, item)
        except Invalid as exc:
            raise Invalid(f"invalid format - {key}: {exc}") from None
        seen[key] = item
    for key, spec in keys.items():
        if not spec.get("optional") and "alias" not in spec and key not in seen:
            if spec.get("default_key") and "default" in spec:
                continue
            raise Invalid(f"invalid format - {key}: property is missing and it is not optional")


def _check_smbios_base64(value: str) -> None:
    fields = dict(p.partition("=")[::2] for p in value.split(",") if p)
    if BOOLEAN.match(fields.get("base64", "0")) and fields.get("base64", "0").lower() in (
        "1", "true", "yes", "on",
    ):  # fmt: skip
        for key, item in fields.items():
            if key in ("base64", "uuid"):
                continue
            try:
                base64.b64decode(item, validate=True)
            except (binascii.Error, ValueError):
                raise Invalid(f"invalid format - {key}: invalid base64 value") from None


def _ip(value: str, version: int | None = None, *, network: bool = False) -> bool:
    try:
        parsed = ipaddress.ip_interface(value) if network else ipaddress.ip_address(value)
    except ValueError:
        return False
    if network and "/" not in value:
        return False
    return version is None or parsed.version == version


_SPECIAL: dict[str, Callable[[str], bool]] = {
    "ipv4": lambda v: _ip(v, 4),
    "ipv6": lambda v: _ip(v, 6),
    "ip": lambda v: _ip(v),
    "CIDR": lambda v: _ip(v, network=True),
    "ip-or-dhcp": lambda v: v == "dhcp" or _ip(v, 4, network=True),
    "ip6-or-auto": lambda v: v in ("dhcp", "auto") or _ip(v, 6, network=True),
    "address-list": lambda v: all(_ip(a) for a in re.split(r"[,;\s]+", v) if a),
    "pve-vmid": lambda v: INTEGER.match(v) is not None and 100 <= int(v) <= 999_999_999,
}


def _perl_pattern(pattern: str) -> str:
    """`(?^:\\d+)` (Perl's stringified regex) -> `\\d+`; Proxmox anchors it at both ends."""
    found = re.fullmatch(r"\(\?\^\w*:(.*)\)", pattern, re.DOTALL)
    return found.group(1) if found else pattern


@cache
def shipped() -> Schema:
    """The description shipped in this package (api-subset.json)."""
    text = resources.files("fleet.providers.proxmox").joinpath("api-subset.json").read_text()
    return Schema(json.loads(text))
