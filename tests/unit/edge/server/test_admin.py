"""The admin routes of a server without API keys answer only on the loopback interface."""

from fastapi import FastAPI
from fastapi.testclient import TestClient

from cadenza.config import CadenzaConfig
from cadenza.edge.server import admin
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams.errors import install_error_handlers


def test_an_open_server_refuses_admin_requests_from_other_hosts() -> None:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(admin.router)
    app.state.edge = EdgeState(config=CadenzaConfig(), services={}, metrics=Metrics())
    client = TestClient(app)  # its peer is "testclient", not a loopback address
    for method, path in (("GET", "/admin/replicas"), ("POST", "/admin/drain")):
        response = client.request(method, path)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forbidden"
    assert not app.state.edge.lifecycle.draining  # nothing was started
