import pytest

from cadenza.cluster.node_address import Address, Node, parse_address, parse_node

BAD_NODES = [
    ("garbage", "AGENT_PORT missing; expected HOST:PORT:AGENT_PORT"),
    ("10.0.0.5:8000", "AGENT_PORT missing"),
    ("10.0.0.5:8000:8001:9", "too many ':'"),
    ("10.0.0.5:0:8001", "PORT must be a number from 1 to 65535, not '0'"),
    ("10.0.0.5:70000:8001", "PORT must be a number from 1 to 65535, not '70000'"),
    ("10.0.0.5:8000:70000", "AGENT_PORT must be a number from 1 to 65535, not '70000'"),
    ("10.0.0.5:8000:", "AGENT_PORT must be a number from 1 to 65535, not ''"),
    ("10.0.0.5:+80:81", "PORT must be a number"),
    ("10.0.0.5:８０:81", "PORT must be a number"),  # full-width digits: not ASCII
    (":8000:8001", "HOST is empty"),
    ("[]:8000:8001", "HOST is empty"),
    ("10.0.0.5:8000:8000", "AGENT_PORT must differ from PORT"),
    ("999.1.1.1:8000:8001", "'999.1.1.1' is not an IPv4 address"),
    ("[::1:8000:8001", "expected HOST:PORT:AGENT_PORT"),
    ("[::1]8000:8001", "expected HOST:PORT:AGENT_PORT"),
    ("[node]:8000:8001", "'node' in brackets is not an IPv6 address"),
    ("::1:8000:8001", "too many ':'"),
    ("bad host:8000:8001", "is not a DNS name or an IP address"),
    ("evil\n    server x:8000:8001", "is not a DNS name or an IP address"),
    ("-dash.example:8000:8001", "is not a DNS name or an IP address"),
]


@pytest.mark.parametrize(("text", "why"), BAD_NODES)
def test_a_bad_node_names_the_flag_the_value_and_the_reason(text, why):
    with pytest.raises(ValueError) as raised:
        parse_node(text)
    message = str(raised.value)
    assert message.startswith(f"--node {text!r}: ")
    assert why in message


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("garbage", "PORT missing; expected HOST:PORT, e.g. 10.0.0.5:8000"),
        ("127.0.0.1", "PORT missing"),
        (":8000", "HOST is empty"),
        ("127.0.0.1:0", "PORT must be a number from 1 to 65535, not '0'"),
        ("127.0.0.1:70000", "not '70000'"),
        ("127.0.0.1:8000:8001", "too many ':'"),
        ("", "PORT missing"),
    ],
)
@pytest.mark.parametrize("flag", ["--listen", "--stats"])
def test_a_bad_address_names_the_flag_the_value_and_the_reason(flag, text, why):
    with pytest.raises(ValueError) as raised:
        parse_address(text, flag)
    assert str(raised.value).startswith(f"{flag} {text!r}: ")
    assert why in str(raised.value)


@pytest.mark.parametrize(
    ("text", "node"),
    [
        ("10.0.0.5:8000:8001", Node(Address("10.0.0.5", 8000), 8001)),
        ("node-1.example.com:8000:9000", Node(Address("node-1.example.com", 8000), 9000)),
        ("localhost:1:65535", Node(Address("localhost", 1), 65535)),
        ("[::1]:8000:8001", Node(Address("::1", 8000), 8001)),
        ("[fd00::5]:443:444", Node(Address("fd00::5", 443), 444)),
    ],
)
def test_good_nodes_parse_and_write_back_as_given(text, node):
    assert parse_node(text) == node
    assert str(node) == text


def test_addresses_write_ipv6_in_brackets():
    assert str(parse_address("0.0.0.0:8443", "--listen")) == "0.0.0.0:8443"
    assert str(parse_address("[::]:8443", "--listen")) == "[::]:8443"
