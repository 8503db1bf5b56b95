"""Adversarial tests: the gateway attacked from outside, as a hostile or careless client would."""
