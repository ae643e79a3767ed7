"""Several cadenza nodes behind one address: what lies outside any one server process.

* :mod:`cadenza.cluster.node_address`: a node's address as an operator writes it on the
  command line (``HOST:PORT``, ``HOST:PORT:AGENT_PORT``), parsed and checked.
* :mod:`cadenza.cluster.haproxy_config`: the front door, a complete ``haproxy.cfg`` for
  HAProxy 2.6 that spreads streams over the nodes (``cadenza haproxy-config``,
  docs/scaling.md).

Nothing here runs in a serving process: it renders configuration for other programs, and
imports only the standard library.
"""
