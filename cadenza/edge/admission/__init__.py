"""Admission policy, in the edge process: who may use the server and when a stream may start.

``api_keys`` (who), ``validation`` (what is acceptable), ``guard`` (an input-text policy),
``rate_limit`` (how much per client), ``capacity`` (how many real-time streams the engine
holds, from its measured memory and step time; ``realtime_factor``: how much slower than
calibrated its steps run live; ``factor_memory``: that factor kept across restarts;
``prefill_schedule``: whether the admitted prompts can all be prefilled in time;
``capacity_snapshot``: what ``GET /v1/capacity`` says), ``priority_queues`` and ``gate``
(waiting for capacity, refusing with a reason). :mod:`cadenza.edge.streams.lease` runs them in one
order for every transport.
"""
