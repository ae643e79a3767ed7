"""The front door over real TLS: HAProxy with the configuration ``cadenza haproxy-config
--tls-cert`` renders, in front of a stub node. TLS 1.2 and later are spoken and TLS 1.1 is
refused, every answer carries Strict-Transport-Security, plain HTTP is answered with a 301 to
the same path over HTTPS, and ``/admin`` stays closed at the door on both ports."""

from __future__ import annotations

import http.client
import socket
import ssl
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cadenza.cluster.haproxy_config import HSTS, FrontDoor, render_haproxy_config
from cadenza.cluster.node_address import Address, Node
from tests.support.haproxy_process import require_haproxy, running_haproxy
from tests.support.ports import free_port
from tests.support.self_signed import self_signed_pem
from tests.support.stub_node import StubAgent, StubNode

pytestmark = pytest.mark.timeout(60)


@dataclass
class TlsDoor:
    tls_port: int
    http_port: int
    config: str
    node: StubNode


@pytest.fixture(scope="module")
def door(tmp_path_factory) -> Iterator[TlsDoor]:
    require_haproxy()
    directory = tmp_path_factory.mktemp("haproxy-tls")
    node, agent = StubNode("a"), StubAgent("up 100%")
    tls_port, http_port = free_port(), free_port()
    config = render_haproxy_config(
        FrontDoor(
            listen=Address("127.0.0.1", tls_port),
            nodes=(Node(Address("127.0.0.1", node.port), agent.port),),
            tls_cert_pem=str(self_signed_pem(directory / "front.pem")),
            redirect_http=Address("127.0.0.1", http_port),
        )
    )
    try:
        with running_haproxy(config, directory, [tls_port, http_port]):
            agent.answer("up 100%", polls=1)  # the node is weighed before the first test
            yield TlsDoor(tls_port, http_port, config, node)
    finally:
        node.stop()
        agent.stop()


def _client_context(highest: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that would speak every version up to ``highest`` (the self-signed
    certificate is not what is tested here)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # this client itself refuses nothing old
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # naming TLS 1.0 / 1.1 warns
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = highest
    return context


def _handshake(port: int, highest: ssl.TLSVersion) -> str | None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        _client_context(highest).wrap_socket(sock) as tls,
    ):
        return tls.version()


def _https(door: TlsDoor, method: str, path: str) -> http.client.HTTPResponse:
    connection = http.client.HTTPSConnection(
        "127.0.0.1",
        door.tls_port,
        timeout=10,
        context=_client_context(ssl.TLSVersion.MAXIMUM_SUPPORTED),
    )
    connection.request(method, path, body=b"{}", headers={"Connection": "close"})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_tls_1_2_and_later_are_spoken_and_tls_1_1_is_refused(door: TlsDoor) -> None:
    assert "ssl-min-ver TLSv1.2" in door.config
    assert _handshake(door.tls_port, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    assert _handshake(door.tls_port, ssl.TLSVersion.MAXIMUM_SUPPORTED) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        _handshake(door.tls_port, ssl.TLSVersion.TLSv1_1)


def test_every_https_answer_carries_hsts(door: TlsDoor) -> None:
    served = _https(door, "POST", "/v1/audio/speech")
    assert served.status == 200
    assert served.headers["Strict-Transport-Security"] == HSTS == "max-age=63072000"
    refused = _https(door, "POST", "/admin/drain")  # HAProxy's own answer carries it too
    assert refused.status == 403
    assert refused.headers["Strict-Transport-Security"] == HSTS


def test_plain_http_is_sent_to_https_with_its_path(door: TlsDoor) -> None:
    for host, location in [
        (f"127.0.0.1:{door.http_port}", f"https://127.0.0.1:{door.tls_port}/v1/models?x=1"),
        ("app.example.com", f"https://app.example.com:{door.tls_port}/v1/models?x=1"),
        (f"[::1]:{door.http_port}", f"https://[::1]:{door.tls_port}/v1/models?x=1"),
    ]:
        connection = http.client.HTTPConnection("127.0.0.1", door.http_port, timeout=10)
        connection.request("GET", "/v1/models?x=1", headers={"Host": host})
        response = connection.getresponse()
        connection.close()
        assert response.status == 301, host
        assert response.headers["Location"] == location


def test_admin_is_closed_at_the_door_on_both_ports(door: TlsDoor) -> None:
    door.node.forget()
    for path in ("/admin/drain", "/%61dmin/drain", "/admin/restart?model=x"):
        assert _https(door, "POST", path).status == 403, path
        connection = http.client.HTTPConnection("127.0.0.1", door.http_port, timeout=10)
        connection.request("POST", path, body=b"{}")
        assert connection.getresponse().status == 301  # to HTTPS, where it is refused
        connection.close()
    assert not door.node.served and not door.node.refused
