"""Model families (one file each), the delay pattern, and the registry that builds them."""
