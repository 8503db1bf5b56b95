"""Tests of the vLLM simulator (simulator/)."""
