"""router_models package."""
