"""The MQTT codec's layers: ``codec`` is the public face, its modules import downwards only.

``protocols.mqtt.codec`` re-exports what callers use; the layers under it
(packets, datatypes, properties, decoding, encoding) may each import only
the layers before it, so the decoder and encoder never get tangled back into
the property table or the data types.  Imports are read from the source, so
a lazy import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from protocols.mqtt import codec

PACKAGE = "protocols.mqtt"
MQTT_DIR = Path(codec.__file__).parent

# Each layer and the codec layers it may import (the ones below it).
LAYERS = {
    "packets": set(),
    "datatypes": {"packets"},
    "properties": {"packets", "datatypes"},
    "decoding": {"packets", "datatypes", "properties"},
    "encoding": {"packets", "datatypes", "properties"},
}
CODEC_MODULES = set(LAYERS) | {"codec"}


def imported_codec_modules(module: str, directory: Path = MQTT_DIR) -> set[str]:
    """The codec modules (by short name) that ``module``'s source imports, anywhere in it."""
    tree = ast.parse((directory / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: "from . import x" or "from .x import y"
                base = f"{PACKAGE}.{base}" if base else PACKAGE
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + "."):
                short = name[len(PACKAGE) + 1 :].split(".")[0]
                if short in CODEC_MODULES:
                    found.add(short)
    return found


@pytest.mark.parametrize("name", codec.__all__)
def test_every_public_name_is_importable_from_codec(name):
    # What ``from protocols.mqtt.codec import name`` does: import with a fromlist, then getattr.
    module = __import__(f"{PACKAGE}.codec", fromlist=[name])
    assert getattr(module, name) is getattr(codec, name)
    assert getattr(module, name) is not None


def test_codec_all_covers_what_callers_use():
    # The names the broker, the perf tool and the tests reach through ``codec``.
    used = {
        "MAX_PACKET_SIZE", "MqttProtocolError", "PacketType", "ReasonCode", "ConnackReturnCode",
        "Connect", "Will", "Connack", "Publish", "Puback", "Pubrec", "Pubrel", "Pubcomp",
        "Subscribe", "SubscriptionRequest", "Suback", "Unsubscribe", "Unsuback", "Pingreq",
        "Pingresp", "Disconnect", "Auth", "Packet", "MqttDecoder", "encode", "encode_publish",
        "publish_parts", "encode_variable_byte_integer",
    }
    assert used <= set(codec.__all__)
    assert len(codec.__all__) == len(set(codec.__all__))


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_layers_import_only_the_layers_below(module):
    imported = imported_codec_modules(module)
    assert "codec" not in imported, f"{module} imports the public face, which imports it"
    upward = imported - LAYERS[module]
    assert not upward, f"{module} imports {sorted(upward)}, which it must not"


@pytest.mark.parametrize("module", ["packets", "datatypes", "properties"])
def test_lower_layers_never_reach_the_decoder_or_encoder(module):
    assert not imported_codec_modules(module) & {"decoding", "encoding"}


def test_decoder_and_encoder_are_independent():
    assert "encoding" not in imported_codec_modules("decoding")
    assert "decoding" not in imported_codec_modules("encoding")


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_each_layer_imports_on_its_own(module):
    # The layers checked above are the modules that exist and load.
    # module.py, or module.cpython-311-...so where the hot modules are compiled.
    path = Path(importlib.import_module(f"{PACKAGE}.{module}").__file__ or "")
    assert path.parent == MQTT_DIR and path.name.split(".")[0] == module


def test_the_checker_sees_each_form_of_import(tmp_path):
    # Guard against a vacuous pass: a re-tangled layer must be caught however
    # it imports, at the top or inside a function, absolute or relative.
    (tmp_path / "packets.py").write_text(
        "import protocols.mqtt.encoding\n"
        "from protocols.mqtt import decoding as d\n"
        "def f():\n"
        "    from .codec import encode\n"
        "    from . import properties\n"
    )
    found = imported_codec_modules("packets", tmp_path)
    assert found == {"encoding", "decoding", "codec", "properties"}
