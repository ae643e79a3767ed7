import pytest

from cadenza.cli import main
from cadenza.cluster.haproxy_config import (
    REQUEST_BUFFER_BYTES,
    TIMEOUTS,
    FrontDoor,
    render_haproxy_config,
)
from cadenza.cluster.node_address import Address, parse_node
from cadenza.config import AdmissionConfig, ServerConfig
from tests.support.haproxy_process import check_config
from tests.support.self_signed import self_signed_pem

NODES = (parse_node("127.0.0.1:8000:8001"), parse_node("[::1]:8100:8101"))
LISTEN = Address("127.0.0.1", 8080)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def _section(text: str, header: str) -> list[str]:
    """The lines of the section that starts with ``header`` (up to the blank line)."""
    start = text.index(f"\n{header}\n") + 1
    return _lines(text[start:].split("\n\n")[0])[1:]


def test_haproxy_accepts_the_config(tmp_path):
    text = render_haproxy_config(FrontDoor(LISTEN, NODES, stats=Address("127.0.0.1", 8404)))
    result = check_config(text, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_haproxy_accepts_the_config_with_tls(tmp_path):
    pem = self_signed_pem(tmp_path / "front.pem")
    door = FrontDoor(LISTEN, NODES, tls_cert_pem=str(pem), redirect_http=Address("127.0.0.1", 8081))
    text = render_haproxy_config(door)
    frontend = _section(text, "frontend cadenza")
    assert f"bind 127.0.0.1:8080 ssl crt {pem} ssl-min-ver TLSv1.2" in frontend
    assert "http-request set-header X-Forwarded-Proto https" in frontend
    assert 'http-after-response set-header Strict-Transport-Security "max-age=63072000"' in frontend
    assert "http-request deny deny_status 403 if { path,url_dec -m beg /admin/ }" in frontend
    result = check_config(text, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_plain_http_is_redirected_to_the_tls_port():
    pem = "/etc/cadenza/front.pem"
    redirect = Address("0.0.0.0", 80)
    text = render_haproxy_config(FrontDoor(LISTEN, NODES, tls_cert_pem=pem, redirect_http=redirect))
    assert _section(text, "frontend cadenza_http") == [
        "bind 0.0.0.0:80",
        r"http-request replace-header Host ^(.*?)(:[0-9]+)?$ \1:8080",
        "http-request redirect scheme https code 301",
    ]  # no backend: nothing sent in plain HTTP, /admin included, reaches a node
    on_443 = FrontDoor(Address("0.0.0.0", 443), NODES, tls_cert_pem=pem, redirect_http=redirect)
    assert r"http-request replace-header Host ^(.*?)(:[0-9]+)?$ \1" in _section(
        render_haproxy_config(on_443), "frontend cadenza_http"
    )


def test_without_tls_nothing_changes():
    text = render_haproxy_config(FrontDoor(LISTEN, NODES))
    assert "ssl" not in text and "Strict-Transport-Security" not in text
    assert "redirect" not in text and "cadenza_http" not in text


def test_haproxy_refuses_a_missing_certificate(tmp_path):
    """The renderer does no I/O: a wrong path is HAProxy's to find, and it does."""
    text = render_haproxy_config(FrontDoor(LISTEN, NODES, tls_cert_pem=str(tmp_path / "no.pem")))
    assert check_config(text, tmp_path).returncode != 0


def test_one_http_frontend_and_backend_carry_every_route():
    text = render_haproxy_config(FrontDoor(LISTEN, NODES))
    assert "mode http" in _section(text, "defaults")
    frontend = _section(text, "frontend cadenza")
    assert frontend[0] == "bind 127.0.0.1:8080"
    assert "option forwardfor" in frontend
    assert "http-request set-header X-Forwarded-Proto http" in frontend
    assert "http-request deny deny_status 403 if { path,url_dec -m beg /admin/ }" in frontend
    assert "default_backend cadenza_nodes" in frontend
    assert text.count("\nfrontend ") == 1  # no stats page unless asked for
    assert text.count("\nbackend ") == 1


def test_the_backend_checks_weighs_balances_and_retries():
    backend = _section(render_haproxy_config(FrontDoor(LISTEN, NODES)), "backend cadenza_nodes")
    for line in [
        "balance leastconn",
        "option httpchk GET /readyz",
        "http-check expect status 200",
        "option http-buffer-request",
        "retry-on conn-failure empty-response 503",
        "retries 2",
        "option redispatch 1",
        "default-server check inter 2s fall 2 rise 2 weight 100 agent-check agent-inter 1s",
        "server node1 127.0.0.1:8000 agent-port 8001",
        "server node2 [::1]:8100 agent-port 8101",
    ]:
        assert line in backend


def test_balance_is_a_parameter():
    text = render_haproxy_config(FrontDoor(LISTEN, NODES, balance="roundrobin"))
    assert "balance roundrobin" in _section(text, "backend cadenza_nodes")


def test_the_stats_page_has_its_own_frontend():
    text = render_haproxy_config(FrontDoor(LISTEN, NODES, stats=Address("127.0.0.1", 8404)))
    assert _section(text, "frontend stats") == [
        "bind 127.0.0.1:8404",
        "stats enable",
        "stats uri /",
        "stats refresh 5s",
    ]


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    number = duration.rstrip("smh")
    return float(number) * units[duration[len(number) :]]


def test_timeouts_outlast_what_the_node_allows():
    """HAProxy must never be the one that cuts what a node still allows: a request waiting in
    a node's admission queue, an idle WebSocket the node keeps, a slow request head or body."""
    admission, server = AdmissionConfig(), ServerConfig()
    assert _seconds(TIMEOUTS["server"]) > admission.batch_max_wait_s
    assert _seconds(TIMEOUTS["server"]) > admission.standard_max_wait_s
    assert _seconds(TIMEOUTS["tunnel"]) >= 3600 > server.ws_idle_timeout_s
    assert _seconds(TIMEOUTS["client"]) > server.send_timeout_s
    assert _seconds(TIMEOUTS["http-request"]) > server.request_head_timeout_s
    assert _seconds(TIMEOUTS["http-request"]) > server.request_body_timeout_s


def test_the_largest_request_a_node_accepts_fits_one_buffer():
    """A request is retried on another node only if it fits in one HAProxy buffer."""
    from cadenza.edge.transports.speech_http import MAX_BODY_BYTES

    assert REQUEST_BUFFER_BYTES >= MAX_BODY_BYTES + 8 * 1024  # the body and its headers


@pytest.mark.parametrize(
    ("front_door", "message"),
    [
        (lambda: FrontDoor(LISTEN, ()), "--node: give at least one node"),
        (lambda: FrontDoor(LISTEN, (NODES[0], NODES[0])), "127.0.0.1:8000 is given twice"),
        (lambda: FrontDoor(LISTEN, NODES, stats=LISTEN), "--stats '127.0.0.1:8080': the same"),
        (lambda: FrontDoor(LISTEN, NODES, tls_cert_pem="/a b.pem"), "--tls-cert '/a b.pem'"),
        (lambda: FrontDoor(LISTEN, NODES, tls_cert_pem="x\nglobal"), "--tls-cert"),
        (lambda: FrontDoor(LISTEN, NODES, balance="first"), "--balance 'first': expected"),  # type: ignore[arg-type]
        (
            lambda: FrontDoor(LISTEN, NODES, redirect_http=Address("0.0.0.0", 80)),
            "--redirect-http '0.0.0.0:80': redirects to HTTPS need --tls-cert",
        ),
        (
            lambda: FrontDoor(LISTEN, NODES, tls_cert_pem="/p.pem", redirect_http=LISTEN),
            "--redirect-http '127.0.0.1:8080': the same address as --listen",
        ),
        (
            lambda: FrontDoor(
                LISTEN, NODES, Address("h", 1), tls_cert_pem="/p.pem", redirect_http=Address("h", 1)
            ),
            "--redirect-http 'h:1': the same address as --stats",
        ),
    ],
)
def test_a_front_door_haproxy_could_not_run_is_refused(front_door, message):
    with pytest.raises(ValueError) as raised:
        front_door()
    assert message in str(raised.value)


def test_the_command_prints_the_config(capsys):
    status = main(
        ["haproxy-config", "--listen", "0.0.0.0:8443", "--node", "10.0.0.5:8000:8001",
         "--node", "10.0.0.6:8000:8001", "--stats", "127.0.0.1:8404", "--balance", "roundrobin"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert out == render_haproxy_config(
        FrontDoor(
            Address("0.0.0.0", 8443),
            (parse_node("10.0.0.5:8000:8001"), parse_node("10.0.0.6:8000:8001")),
            stats=Address("127.0.0.1", 8404),
            balance="roundrobin",
        )
    )


@pytest.mark.parametrize(
    ("flags", "redirect"),
    [
        ([], Address("0.0.0.0", 80)),
        (["--redirect-http", "10.0.0.1:8081"], Address("10.0.0.1", 8081)),
        (["--redirect-http", "off"], None),
    ],
)
def test_the_command_redirects_plain_http_with_tls(capsys, flags, redirect):
    node = "10.0.0.5:8000:8001"
    base = ["haproxy-config", "--listen", "0.0.0.0:443", "--node", node, "--tls-cert", "/f.pem"]
    assert main([*base, *flags]) == 0
    assert capsys.readouterr().out == render_haproxy_config(
        FrontDoor(
            Address("0.0.0.0", 443),
            (parse_node(node),),
            tls_cert_pem="/f.pem",
            redirect_http=redirect,
        )
    )


def test_the_command_listening_on_80_with_tls_redirects_nothing(capsys):
    flags = ["--listen", "0.0.0.0:80", "--node", "10.0.0.5:8000:8001", "--tls-cert", "/f.pem"]
    assert main(["haproxy-config", *flags]) == 0
    assert "cadenza_http" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (
            ["--listen", "127.0.0.1:1", "--node", "a:2:3", "--redirect-http", "127.0.0.1:80"],
            "--redirect-http '127.0.0.1:80': redirects to HTTPS need --tls-cert",
        ),
        (
            ["--listen", "h:1", "--node", "a:2:3", "--tls-cert", "/f", "--redirect-http", "x"],
            "--redirect-http 'x'",
        ),
        (["--listen", "127.0.0.1:8080", "--node", "10.0.0.5:8000"], "--node '10.0.0.5:8000'"),
        (["--listen", "127.0.0.1", "--node", "10.0.0.5:8000:8001"], "--listen '127.0.0.1'"),
        (
            ["--listen", "127.0.0.1:1", "--node", "a:2:3", "--stats", "127.0.0.1:0"],
            "--stats '127.0.0.1:0'",
        ),
        (["--listen", ":1", "--node", "a:2:3", "--node", "a:2:4"], "--listen ':1'"),
        (["--listen", "h:1", "--node", "a:2:3", "--node", "a:2:4"], "a:2 is given twice"),
    ],
)
def test_the_command_refuses_bad_input_with_status_2(capsys, flags, named):
    assert main(["haproxy-config", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert named in captured.err


def test_the_command_requires_listen_and_a_node(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["haproxy-config", "--listen", "127.0.0.1:8080"])
    assert exited.value.code == 2
    assert "--node" in capsys.readouterr().err
