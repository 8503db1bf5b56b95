"""TierGate test suite."""
