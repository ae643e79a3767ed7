"""How a node names itself to its clients and its operator (``server.node_id``, default
``host:port``): every HTTP response carries ``x-cadenza-node``, the WebSocket ``ready``
greeting a ``node`` field, and every metric sample a ``node`` label, so a client behind the
front door and a dashboard over the fleet can tell which node served what."""

from __future__ import annotations

NODE_HEADER = "x-cadenza-node"


def with_node_label(exposition: str, node: str) -> str:
    """Prometheus text ``exposition`` with ``node="<node>"`` added to every sample, after its
    own labels (comment lines unchanged); ``node`` is escaped as the format wants."""
    label = 'node="' + node.replace("\\", "\\\\").replace('"', '\\"') + '"'
    lines = []
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            lines.append(line)
            continue
        name_end = min(i for i in (line.find("{"), line.find(" ")) if i >= 0)
        name, rest = line[:name_end], line[name_end:]
        if rest.startswith("{"):  # the sample's own labels first, the node's last
            close = rest.rindex("}")
            own = rest[1:close]
            labels = f"{own},{label}" if own else label
            lines.append(f"{name}{{{labels}}}{rest[close + 1 :]}")
        else:
            lines.append(f"{name}{{{label}}}{rest}")
    return "\n".join(lines) + "\n"
