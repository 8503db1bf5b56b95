"""Settings, read once: the typed model, the YAML file, strict keys, the generated reference,
the exposure check.
"""
