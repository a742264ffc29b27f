"""The protocol vectors (protocol/vectors.json), which pycell's Rust codec
checks too: each decodes, strictly, into this package's messages and
encodes back unchanged, and every stable code the vectors and
docs/errors.md name has its exception class."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest

from pycell import errors, protocol

REPO = pathlib.Path(__file__).resolve().parents[2]
VECTORS = json.loads((REPO / "protocol" / "vectors.json").read_text())["vectors"]


def test_the_vectors_are_of_this_version() -> None:
    data = json.loads((REPO / "protocol" / "vectors.json").read_text())
    assert data["version"] == protocol.PROTOCOL_VERSION


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_each_vector_decodes_and_encodes_back_unchanged(vector: dict[str, Any]) -> None:
    message = protocol.decode(vector["message"], sent_by=vector["from"], strict=True)
    assert protocol.encode(message) == vector["message"]
    # And through a frame, as the wire carries it.
    if vector["from"] == "client":
        body = protocol.frame(message)
        assert protocol.frame_length(body[:4]) == len(body) - 4
        assert json.loads(body[4:]) == vector["message"]


def test_a_changed_field_is_caught() -> None:
    result = next(v for v in VECTORS if v["name"] == "result-ok")["message"]
    renamed = json.loads(json.dumps(result))
    renamed["result"]["wall_time_ms"] = renamed["result"].pop("wall_ms")
    with pytest.raises(errors.ProtocolError, match="wall_time_ms"):
        protocol.decode(renamed, strict=True)
    wrong_type = json.loads(json.dumps(result))
    wrong_type["result"]["exit_code"] = "0"
    with pytest.raises(errors.ProtocolError, match="exit_code"):
        protocol.decode(wrong_type)


def test_every_message_type_has_a_vector() -> None:
    sent = {(v["from"], v["message"]["type"]) for v in VECTORS}
    for kind in protocol.CLIENT_MESSAGES:
        assert ("client", kind) in sent, kind
    for kind in protocol.DAEMON_MESSAGES:
        assert ("daemon", kind) in sent, kind


def test_every_documented_code_has_its_exception() -> None:
    text = (REPO / "docs" / "errors.md").read_text()
    # The failure codes' table, and the protocol's own codes.
    sections = [
        text.split("## Failure codes")[1].split("\n## ")[0],
        text.split("## Protocol error codes")[1].split("\n## ")[0],
    ]
    codes = {c for s in sections for c in re.findall(r"^\| `([a-z_]+)` \|", s, re.M)}
    assert codes == set(errors.CODES), (sorted(codes - set(errors.CODES)), sorted(set(errors.CODES) - codes))
    for v in VECTORS:
        if v["message"]["type"] == "error":
            assert v["message"]["code"] in errors.CODES
    assert isinstance(errors.error_for("deps_no_wheel", "x"), errors.DependencyError)
    assert errors.error_for("some_new_code", "x").code == "some_new_code"
