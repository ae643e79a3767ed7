"""The edge/engine contract: what crosses the process boundary, and the arithmetic both sides
must agree on. Torch-free (numpy and msgpack only), so the edge process can import all of it.

==================  ========================================================================
module              what it defines
==================  ========================================================================
``sampling``        :class:`SamplingParams`, a request's sampling settings
``request``         :class:`SynthesisRequest` (edge -> engine) and :class:`StreamOutput`
                    (engine -> edge), :class:`FinishReason`
``stream_length``   how long a stream is, in seconds, codec frames and decode steps (from its
                    text and the limits): the length rule both sides use; the nominal stream
``kv_memory``       KV bytes per token, pages per stream: the one formula both sides use
``step_time_model`` the real-time model: step time as a function of the step's work
``calibration``     a measured step-time model, as the engine sends it and caches it
``realtime_plan``   the engine's real-time contract with its streams (chunk sizes, TTFA)
``arrival_wave``    how many streams a replica can start at once and keep on time
``cpu_replicas``    how a model's engine replicas divide a CPU's cores
``host_nodes``      the nodes live on this host (a registry of lock files), which divide its
                    cores
``precision``       the dtypes an engine computes in, as it announces them
``native_kernels``  which native CPU kernels an engine runs, or why not
``engine_info``     what the engine announces once it is ready (identity, shape, capacity)
``engine_stats``    what it reports every 0.5 s (counters, step times, chunk slack)
``errors``          the errors a stream can end with, and their codes
``messages``        the wire messages, one dataclass per kind, one encoder and one decoder
==================  ========================================================================
"""
