"""The backends: replicas, health and detection, the one upstream client, retries, the stream
relay.
"""
