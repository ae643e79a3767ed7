"""Token layouts: how a model's tokens spell codec frames (``token_layout`` has the contract;
``flat``, ``delay_pattern`` and ``frame_rows``, a whole frame a step for two-level models,
the audio layouts)."""
