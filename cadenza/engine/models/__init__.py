"""Model families (one file each) behind :class:`~cadenza.engine.models.model.AudioTokenModel`,
checkpoint loading, and the registry that builds a model from its name."""
