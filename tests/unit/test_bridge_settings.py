"""``[[bridges]]`` as an operator writes it: what is accepted, and the exact error for what is not."""
from __future__ import annotations

import pytest

from gateway.config import ConfigError, load
from protocols.bridge.bridge import OutRule
from protocols.bridge.settings import BridgeTopic
from protocols.mqtt import codec as mq


def write(tmp_path, text: str) -> str:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return str(path)


BRIDGE = '''
[[bridges]]
name = "cloud"
url = "mqtts://broker.example:8884"
version = 5
user = "edge"
password_file = "secret"
ca = "ca.pem"
restart_timeout = [2, 30]
  [[bridges.topics]]
  pattern = "sensors/#"
  remote_prefix = "site1/"
  [[bridges.topics]]
  pattern = "cmd/+"
  direction = "in"
  qos = 2
  local_prefix = "local/"
'''


def test_a_bridge_is_read_with_its_topics_defaults_and_paths_beside_the_file(tmp_path):
    config = load(write(tmp_path, BRIDGE))
    (bridge,) = config.bridges
    assert (bridge.name, bridge.protocol, bridge.tls, bridge.host, bridge.port) == ("cloud", "mqtt", True, "broker.example", 8884)
    assert bridge.version == 5 and bridge.user == "edge" and bridge.restart_timeout == [2.0, 30.0]
    assert bridge.password_file == str(tmp_path / "secret") and bridge.ca == str(tmp_path / "ca.pem")
    assert bridge.clean_session is False and bridge.client_id == "" and bridge.try_private is True
    out, inward = bridge.topics
    assert (out.direction, out.qos, out.local_prefix, out.remote_prefix) == ("out", 1, "", "site1/")
    assert (inward.direction, inward.qos, inward.local_prefix) == ("in", 2, "local/")


def test_default_ports_follow_the_scheme(tmp_path):
    text = '[[bridges]]\nname = "a"\nurl = "mqtt://h"\n[[bridges.topics]]\npattern = "#"\n'
    assert load(write(tmp_path, text)).bridges[0].port == 1883


@pytest.mark.parametrize("text, error", [
    ('[[bridges]]\nurl = "mqtt://h"\n', 'needs name'),
    ('[[bridges]]\nname = "a"\nurl = "http://h"\n[[bridges.topics]]\npattern = "#"\n', "url must start with one of mqtt://"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://"\n[[bridges.topics]]\npattern = "#"\n', "names no host"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\n', "no [[bridges.topics]]"),
    ('[[bridges]]\nname = "a b"\nurl = "mqtt://h"\n[[bridges.topics]]\npattern = "#"\n', "name must be letters"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\nversion = 3\n[[bridges.topics]]\npattern = "#"\n', "version must be 4"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\n[[bridges.topics]]\npattern = "#"\ndirection = "up"\n', "direction must be"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\n[[bridges.topics]]\npattern = "a/#/b"\n', "'#' must be the last level"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\n[[bridges.topics]]\npattern = "#"\nremote_prefix = "x/+/"\n', "cannot hold a wildcard"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\npassword = "p"\n[[bridges.topics]]\npattern = "#"\n', "a password needs a user"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\nrestart_timeout = [5, 1]\n[[bridges.topics]]\npattern = "#"\n', "restart_timeout"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\nport = 1\n[[bridges.topics]]\npattern = "#"\n', "unknown setting [bridges 'a'] port"),
    ('[[bridges]]\nname = "a"\nurl = "stomp://h"\n[[bridges.topics]]\npattern = "sensors/#"\n', "starts with /topic/ or /queue/"),
    ('[[bridges]]\nname = "a"\nurl = "stomp://h"\n[[bridges.topics]]\npattern = "/queue/a.*"\n', "without wildcards"),
    ('[[bridges]]\nname = "a"\nurl = "stomp://h"\n[[bridges.topics]]\npattern = "/topic/a.>.b"\n', "'>' must be the last level"),
    ('[[bridges]]\nname = "a"\nurl = "stomp://h"\n[[bridges.topics]]\npattern = "/topic/"\n', "names nothing"),
    ('[[bridges]]\nname = "a"\nurl = "mqtt://h"\n[[bridges.topics]]\npattern = "#"\n'
     '[[bridges]]\nname = "a"\nurl = "mqtt://g"\n[[bridges.topics]]\npattern = "#"\n', "used twice"),
])
def test_a_bad_bridge_is_refused_naming_what_is_wrong(tmp_path, text, error):
    with pytest.raises(ConfigError) as raised:
        load(write(tmp_path, text))
    assert error in str(raised.value)


def test_names_map_with_mosquittos_prefix_semantics():
    rule = OutRule(BridgeTopic("sensors/#", "out", local_prefix="edge/", remote_prefix="site1/"))
    assert rule.local_filter == "topic://edge.sensors.>"
    assert rule.remote_topic("topic://edge.sensors.room1.temp") == "site1/sensors/room1/temp"
    # A '.' inside an MQTT level survives the round trip.
    assert rule.remote_topic("topic://edge.sensors.v1/2") == "site1/sensors/v1.2"


def test_stomp_names_take_the_prefixes_after_the_kind():
    topic = OutRule(BridgeTopic("/topic/sensors.>", "out", local_prefix="edge.", remote_prefix="site1."), stomp=True)
    assert topic.local_filter == "topic://edge.sensors.>"
    assert topic.remote_topic("topic://edge.sensors.room1") == "/topic/site1.sensors.room1"
    queue = OutRule(BridgeTopic("/queue/orders", "out", remote_prefix="site1."), stomp=True)
    assert (queue.kind, queue.local_filter) == ("queue://", "queue://orders")
    assert queue.remote_topic("queue://orders") == "/queue/site1.orders"


def test_a_stomp_bridge_is_read_with_its_default_port(tmp_path):
    text = '[[bridges]]\nname = "a"\nurl = "stomp+ssl://h"\n[[bridges.topics]]\npattern = "/queue/q"\ndirection = "in"\n'
    (bridge,) = load(write(tmp_path, text)).bridges
    assert (bridge.protocol, bridge.tls, bridge.port) == ("stomp", True, 61612)
    # STOMP's host header is the virtual host: RabbitMQ refuses a CONNECT naming a host it does not have.
    assert bridge.virtual_host == "/"
    bridge.url = "stomp://h:61613/prod%2Feu"
    assert bridge.virtual_host == "prod/eu"


def test_the_bridge_bit_of_a_3x_connect_is_read_as_mosquitto_sends_it():
    for level, layout in ((0x84, 4), (0x83, 3)):
        name = "MQTT" if layout == 4 else "MQIsdp"
        data = mq.encode(mq.Connect(name, level, False, 60, "edge"), layout)
        (packet,) = mq.MqttDecoder().feed(data)
        assert isinstance(packet, mq.Connect)
        assert (packet.level, packet.bridge) == (layout, True)
    (plain,) = mq.MqttDecoder().feed(mq.encode(mq.Connect("MQTT", 4, False, 60, "c"), 4))
    assert plain.bridge is False
    with pytest.raises(mq.MqttProtocolError):
        mq.MqttDecoder().feed(mq.encode(mq.Connect("MQTT", 0x85, False, 60, "c"), 5))


def test_a_network_is_read_with_its_defaults(tmp_path):
    config = load(write(tmp_path, '[network]\npeers = ["10.0.0.2:61613", "stomp+ssl://10.0.0.3:61612"]\nttl = 2\n'
                                  'restart_timeout = 5\nca = "ca.pem"\n'))
    network = config.network
    assert network.peers == ["10.0.0.2:61613", "stomp+ssl://10.0.0.3:61612"] and network.ttl == 2
    assert network.restart_timeout == [5.0, 5.0] and network.ca == str(tmp_path / "ca.pem")
    first, second = (network.link_settings(p) for p in network.peers)
    assert (first.url, first.port, first.tls, first.name) == ("stomp://10.0.0.2:61613", 61613, False, "network-10.0.0.2-61613")
    assert (second.port, second.tls) == (61612, True)
    assert load(write(tmp_path, "")).network.peers == []


@pytest.mark.parametrize("text, error", [
    ('[network]\npeers = ["mqtt://h:1883"]\n', "peers are STOMP listeners"),
    ('[network]\npeers = ["h:notaport"]\n', "peer 'h:notaport'"),
    ('[network]\npeers = ["h:1", "stomp://h:1"]\n', "listed twice"),
    ('[network]\nttl = 0\n', "ttl must be 1-255"),
    ('[network]\nname = "a b"\n', "name must be letters"),
    ('[network]\npassword = "x"\n', "a password needs a user"),
    ('[network]\nhops = 2\n', "unknown setting [network] hops"),
])
def test_a_bad_network_is_refused_naming_what_is_wrong(tmp_path, text, error):
    with pytest.raises(ConfigError) as raised:
        load(write(tmp_path, text))
    assert error in str(raised.value)
