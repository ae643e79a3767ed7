"""Token layouts: how a model's tokens spell codec frames (``token_layout`` has the contract;
``flat`` and ``delay_pattern`` the two audio layouts)."""
